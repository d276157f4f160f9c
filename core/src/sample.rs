//! Sampling the next token from logits.
