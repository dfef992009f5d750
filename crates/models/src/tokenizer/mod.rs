//! The models' tokenizers.

pub mod bpe;
