//! The two tokenizers, each written by hand to give the same ids as the model's own tokenizer:
//! WordPiece for MiniLM ([`wordpiece`]) and byte-level BPE for SmolLM2 ([`bpe`]).

pub mod bpe;
pub mod wordpiece;
