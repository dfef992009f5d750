//! The two tokenizers, each written by hand to give the same ids as the model's `tokenizer.json`.

pub mod wordpiece;
