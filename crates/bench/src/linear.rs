//! The forward passes' matrix products (`models::ops::linear`, y = x W^T with the bits of a
//! fixed summation order) against the machine's f32 matmul peak on the same shapes, in the same
//! run: `matrixmultiply`'s sgemm (through ndarray's `dot`), which is free to use FMA and any
//! summation order, so it bounds what a matmul reaches on this CPU. Both run on the same pool:
//! `linear` splits its output columns over the pool's threads itself; sgemm, single-threaded,
//! runs on one slice of the tokens per thread.
//!
//! The shapes are SmolLM2-135M's and Gemma 3 270M's projections at a 256-token block and their
//! LM heads at the 64-row blocks the quality study scores. GFLOP/s count 2 x tokens x inputs x
//! outputs per call.

use ndarray::{Array2, s};
use serde::Serialize;
use tabled::builder::Builder;
use tabled::settings::object::Columns;
use tabled::settings::{Alignment, Style};

use crate::data;
use crate::measure::{Settings, median_seconds, on_slices, slices};

/// One projection: `tokens` rows of `inputs` features times a [`outputs`, `inputs`] weight.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub model: &'static str,
    pub name: &'static str,
    pub tokens: usize,
    pub inputs: usize,
    pub outputs: usize,
}

const fn shape(
    model: &'static str,
    name: &'static str,
    tokens: usize,
    inputs: usize,
    outputs: usize,
) -> Shape {
    Shape {
        model,
        name,
        tokens,
        inputs,
        outputs,
    }
}

/// Every projection of both decoders (hidden 576 and 640), and their LM heads.
pub fn full() -> Vec<Shape> {
    vec![
        shape("smollm2", "q, o", 256, 576, 576),
        shape("smollm2", "k, v", 256, 576, 192),
        shape("smollm2", "gate, up", 256, 576, 1536),
        shape("smollm2", "down", 256, 1536, 576),
        shape("smollm2", "lm head", 64, 576, 49152),
        shape("gemma3", "q", 256, 640, 1024),
        shape("gemma3", "o", 256, 1024, 640),
        shape("gemma3", "k, v", 256, 640, 256),
        shape("gemma3", "gate, up", 256, 640, 2048),
        shape("gemma3", "down", 256, 2048, 640),
        shape("gemma3", "lm head", 64, 640, 262144),
    ]
}

/// Two small shapes, to check in seconds that the family runs.
pub fn quick() -> Vec<Shape> {
    vec![
        shape("smollm2", "gate, up", 32, 576, 1536),
        shape("smollm2", "down", 32, 1536, 576),
    ]
}

/// One measured shape, as `bench --json` prints it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinearRow {
    /// Always `linear`.
    pub op: &'static str,
    pub model: &'static str,
    pub name: &'static str,
    pub tokens: usize,
    pub inputs: usize,
    pub outputs: usize,
    /// Median seconds of one `models::ops::linear` call.
    pub median_s: f64,
    /// Median seconds of sgemm on the same shape.
    pub sgemm_median_s: f64,
    /// 2 x tokens x inputs x outputs / median, in 10^9 per second.
    pub gflops: f64,
    pub sgemm_gflops: f64,
    /// `gflops / sgemm_gflops`.
    pub of_peak: f64,
    pub threads: usize,
}

/// Measures every shape on `pool`, handing each row to `record`.
pub fn run(
    shapes: &[Shape],
    settings: Settings,
    pool: &rayon::ThreadPool,
    record: &mut dyn FnMut(LinearRow),
) {
    for (i, s) in shapes.iter().enumerate() {
        let seed = 40 + 2 * i as u64;
        let x = Array2::from_shape_vec(
            (s.tokens, s.inputs),
            data::gaussian_like(s.tokens * s.inputs, seed),
        )
        .expect("tokens x inputs values");
        let w = Array2::from_shape_vec(
            (s.outputs, s.inputs),
            data::gaussian_like(s.outputs * s.inputs, seed + 1),
        )
        .expect("outputs x inputs values");
        let median_s = median_seconds(settings, || {
            let y = pool.install(|| models::ops::linear(x.view(), w.view(), None));
            std::hint::black_box(y);
        });
        let parts = slices(s.tokens, settings.threads, 1);
        let sgemm_median_s = median_seconds(settings, || {
            let y = on_slices(pool, &parts, |rows| x.slice(s![rows, ..]).dot(&w.t()));
            std::hint::black_box(y);
        });
        let flop = 2.0 * (s.tokens * s.inputs * s.outputs) as f64;
        let gflops = flop / median_s / 1e9;
        let sgemm_gflops = flop / sgemm_median_s / 1e9;
        record(LinearRow {
            op: "linear",
            model: s.model,
            name: s.name,
            tokens: s.tokens,
            inputs: s.inputs,
            outputs: s.outputs,
            median_s,
            sgemm_median_s,
            gflops,
            sgemm_gflops,
            of_peak: gflops / sgemm_gflops,
            threads: settings.threads,
        });
    }
}

/// The rows as an aligned text table.
pub fn table(rows: &[LinearRow]) -> String {
    let mut builder = Builder::default();
    builder.push_record([
        "model",
        "projection",
        "tokens x in x out",
        "linear GFLOP/s",
        "sgemm GFLOP/s",
        "of sgemm",
    ]);
    for r in rows {
        builder.push_record([
            r.model.to_string(),
            r.name.to_string(),
            format!("{} x {} x {}", r.tokens, r.inputs, r.outputs),
            format!("{:.1}", r.gflops),
            format!("{:.1}", r.sgemm_gflops),
            format!("{:.2}", r.of_peak),
        ]);
    }
    let mut table = builder.build();
    table
        .with(Style::markdown())
        .modify(Columns::new(0..), Alignment::right());
    table.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quick_shapes_are_measured_with_their_flop_counts() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let settings = Settings {
            warmup: 0,
            repeats: 1,
            threads: 2,
        };
        let mut rows = Vec::new();
        run(&quick(), settings, &pool, &mut |row| rows.push(row));
        assert_eq!(rows.len(), quick().len());
        for (row, shape) in rows.iter().zip(quick()) {
            assert_eq!(
                (row.tokens, row.inputs, row.outputs),
                (shape.tokens, shape.inputs, shape.outputs)
            );
            let flop = 2.0 * (shape.tokens * shape.inputs * shape.outputs) as f64;
            assert!((row.gflops * row.median_s * 1e9 - flop).abs() <= 1e-6 * flop);
            assert!((row.of_peak - row.gflops / row.sgemm_gflops).abs() < 1e-12);
        }
        assert!(table(&rows).contains("576 x 1536"));
    }
}
