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
use crate::error::Result;

pub trait Backend {
    /// The most tokens one batch may hold.
    fn max_batch(&self) -> usize;
    /// Positions the KV cache holds now.
    fn kv_len(&self) -> usize;
    /// Positions the KV cache can hold.
    fn kv_capacity(&self) -> usize;
    /// `X` ← the embeddings of `tokens`, which take positions `pos0 ..`.
    fn embed(&mut self, tokens: &[u32], pos0: usize) -> Result<()>;
    /// `Q`, `K`, `V` ← RMSNorm(`X`)·W{q,k,v}ᵀ, plus the biases where the model has them.
    fn qkv(&mut self, layer: usize, n: usize) -> Result<()>;
    /// Rotates `Q` and `K` for positions `pos0 ..`, and stores `K` and `V` there in the cache.
    fn rope_store(&mut self, layer: usize, n: usize, pos0: usize) -> Result<()>;
    /// `Att` ← causal attention of `Q` over the layer's cached positions `0 .. pos0 + n`.
    fn attention(&mut self, layer: usize, n: usize, pos0: usize) -> Result<()>;
    /// `X` += `Att`·Woᵀ.
    fn attn_out(&mut self, layer: usize, n: usize) -> Result<()>;
    /// `Gate`, `Up` ← RMSNorm(`X`)·W{gate,up}ᵀ.
    fn gate_up(&mut self, layer: usize, n: usize) -> Result<()>;
    /// `X` += (SiLU(`Gate`)·`Up`)·W_downᵀ.
    fn ffn_out(&mut self, layer: usize, n: usize) -> Result<()>;
    /// `Out` rows `first .. first + n` ← the final RMSNorm of those rows of `X`.
    fn final_norm(&mut self, first: usize, n: usize) -> Result<()>;
    /// Copies the first `out.len() / hidden_size` rows of `Out` to `out`.
    fn read_hidden(&mut self, out: &mut [f32]) -> Result<()>;
    /// `out` ← logits of `Out` rows `first ..` (`out.len() / vocab_size` of them).
    fn logits(&mut self, first: usize, out: &mut [f32]) -> Result<()>;
    /// The id of the largest logit of `Out` row `row` (greedy decoding: a GPU reads back one
    /// number instead of the logits).
    fn argmax(&mut self, row: usize) -> Result<u32>;
    /// Ends a batch of `n` tokens: their positions now belong to the cache.
    fn commit(&mut self, n: usize) -> Result<()>;
}
