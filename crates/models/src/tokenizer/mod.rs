//! The three tokenizers, each written by hand to give the same ids as the model's own tokenizer:
//! WordPiece for MiniLM ([`wordpiece`]), byte-level BPE for SmolLM2 ([`bpe`]) and llama.cpp's
//! SentencePiece (SPM) for Gemma 3 ([`spm`]).

pub mod bpe;
pub mod spm;
pub mod wordpiece;
