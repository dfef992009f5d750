//! GGUF files (placeholder: the reader lands in the next commit).
