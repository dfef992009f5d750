//! What every evidence format needs: reading the evidence safely and exactly (confined files, the
//! strict npz reader, hashes, summary.md as a renderer reads it, the charts' SVG), the manifest
//! pieces and provenance both formats record, the root manifest's pins, and the report.

pub mod files;
pub mod hashes;
pub mod manifest;
pub mod markdown;
pub mod model_files;
pub mod models;
pub mod npz;
pub mod options;
pub mod outputs;
pub mod panels;
pub mod pins;
pub mod problem;
pub mod report;
pub mod sample;
pub mod sources;
pub mod svg;
pub mod text;
pub mod tolerance;
