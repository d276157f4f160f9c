//! The steps of the layer loop, which every backend implements.
//!
//! `model::layer_loop` is the only copy of the Llama layer loop; it calls these steps in order.
//! Each step is what a GPU runs as one or two fused dispatches (the norm in a mat-vec's prologue,
//! the bias and the residual add in its epilogue, SiLU·mul in the down projection's input), so
//! the trait is cut where fusing pays, and the backend decides where its buffers live: the CPU's
//! in the caller's arenas, a GPU's on the device. Each backend holds the activations of a batch
//! by role, named below as the loop uses them:
//!
//! - `X`: the residual stream, `n × hidden_size`;
//! - `Q`, `K`, `V`: a layer's projections (`n × q_dim`, `n × kv_dim`);
//! - `Att`: attention's output, `n × q_dim`;
//! - `Gate`, `Up`: the feed-forward's projections, `n × intermediate_size`;
//! - `Out`: the final norm's output, `n × hidden_size`.
//!
//! A batch may hold tokens of several sequences, each with its own KV cache: the batch is cut
//! into `Segment`s, runs of one sequence's consecutive tokens. The mat-muls see only rows; the
//! steps that place a token (its position, its cache, what it attends to) take the segments.
use crate::error::Result;

/// A run of one sequence's consecutive tokens inside a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Segment {
    /// Which sequence (and KV cache).
    pub seq: usize,
    /// Where its tokens start in the sequence's input.
    pub offset: usize,
    /// Its first row in the batch.
    pub row: usize,
    /// How many tokens.
    pub len: usize,
    /// The position of its first token (the cache's length when the batch starts).
    pub pos0: usize,
}

/// Where the layer loop's steps run: the CPU (`Model`, over the caller's arenas) or a GPU (the
/// std frontend's). A backend holds one batch's activations, named as the module says.
pub trait Backend {
    /// The most tokens one batch may hold.
    fn max_batch(&self) -> usize;
    /// How many sequences (KV caches) this backend runs at once.
    fn sequences(&self) -> usize;
    /// Positions sequence `seq`'s KV cache holds now.
    fn kv_len(&self, seq: usize) -> usize;
    /// Positions sequence `seq`'s KV cache can hold.
    fn kv_capacity(&self, seq: usize) -> usize;
    /// `X` ← the embeddings of the batch's tokens: each segment's tokens are
    /// `tokens[seq][offset .. offset + len]`, at positions `pos0 ..`.
    ///
    /// # Errors
    /// The backend's own failures, and arguments that do not fit the batch.
    fn embed(&mut self, tokens: &[&[u32]], segments: &[Segment]) -> Result<()>;
    /// `Q`, `K`, `V` ← RMSNorm(`X`)·W{q,k,v}ᵀ, plus the biases where the model has them.
    ///
    /// # Errors
    /// The backend's own failures, and arguments that do not fit the batch.
    fn qkv(&mut self, layer: usize, n: usize) -> Result<()>;
    /// Rotates `Q` and `K` for each token's position, and stores `K` and `V` there in its
    /// sequence's cache (where `qkv` did not already: the GPU's does it in its epilogue).
    ///
    /// # Errors
    /// The backend's own failures, and arguments that do not fit the batch.
    fn rope_store(&mut self, layer: usize, segments: &[Segment]) -> Result<()>;
    /// `Att` ← causal attention of each segment's `Q` rows over its sequence's cached positions
    /// `0 .. pos0 + len`.
    ///
    /// # Errors
    /// The backend's own failures, and arguments that do not fit the batch.
    fn attention(&mut self, layer: usize, segments: &[Segment]) -> Result<()>;
    /// `X` += `Att`·Woᵀ.
    ///
    /// # Errors
    /// The backend's own failures, and arguments that do not fit the batch.
    fn attn_out(&mut self, layer: usize, n: usize) -> Result<()>;
    /// `Gate`, `Up` ← RMSNorm(`X`)·W{gate,up}ᵀ. A backend may go on to `Gate` ← SiLU(`Gate`)·`Up`
    /// here (the CPU does, while the products are at hand) instead of in `ffn_out`.
    ///
    /// # Errors
    /// The backend's own failures, and arguments that do not fit the batch.
    fn gate_up(&mut self, layer: usize, n: usize) -> Result<()>;
    /// `X` += (SiLU(`Gate`)·`Up`)·W_downᵀ (or `Gate`·W_downᵀ, where `gate_up` did the rest).
    ///
    /// # Errors
    /// The backend's own failures, and arguments that do not fit the batch.
    fn ffn_out(&mut self, layer: usize, n: usize) -> Result<()>;
    /// `Out` rows `first .. first + n` ← the final RMSNorm of those rows of `X`.
    ///
    /// # Errors
    /// The backend's own failures, and arguments that do not fit the batch.
    fn final_norm(&mut self, first: usize, n: usize) -> Result<()>;
    /// Copies `Out` rows `first ..` (`out.len() / hidden_size` of them) to `out`.
    ///
    /// # Errors
    /// The backend's own failures, and arguments that do not fit the batch.
    fn read_hidden(&mut self, first: usize, out: &mut [f32]) -> Result<()>;
    /// `out` ← logits of `Out` rows `first ..` (`out.len() / vocab_size` of them).
    ///
    /// # Errors
    /// The backend's own failures, and arguments that do not fit the batch.
    fn logits(&mut self, first: usize, out: &mut [f32]) -> Result<()>;
    /// The id of the largest logit of `Out` row `row` (greedy decoding: a GPU reads back one
    /// number instead of the logits).
    ///
    /// # Errors
    /// The backend's own failures, and arguments that do not fit the batch.
    fn argmax(&mut self, row: usize) -> Result<u32>;
    /// How many rows `logits_rows` takes at once; 1 (the default) for a backend that runs one
    /// sequence, where a batch never has two last tokens.
    fn max_logit_rows(&self) -> usize {
        1
    }
    /// Logits of `Out` rows `rows` (ascending, at most `max_logit_rows`), `rows.len() ×
    /// vocab_size` in the backend's own memory: the last tokens of several sequences through the
    /// output matrix at once, so that it is read once for all of them.
    ///
    /// # Errors
    /// [`Error::Backend`](crate::Error::Backend) from a backend that runs one sequence; rows
    /// outside the batch or more than `max_logit_rows` of them.
    fn logits_rows(&mut self, rows: &[usize]) -> Result<&[f32]> {
        let _ = rows;
        Err(crate::error::Error::Backend(
            "this backend computes the logits of one sequence at a time",
        ))
    }
    /// Ends a batch: each segment's positions now belong to its sequence's cache.
    ///
    /// # Errors
    /// The backend's own failures, and arguments that do not fit the batch.
    fn commit(&mut self, segments: &[Segment]) -> Result<()>;
}
