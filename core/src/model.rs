//! The Llama layer loop: one loop for Llama 1/2/3, SmolLM, Mistral, Qwen2 and the SmolVLM text
//! backbone, written against `Backend`.
use alloc::vec::Vec;

use crate::arena::{Buffers, Scratch};
use crate::backend::{AttentionShape, Backend, Cpu};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::exec::Exec;
use crate::kernels::{Kernels, TILE};
use crate::kv_cache::KvCache;
use crate::ops;
use crate::weights::Weights;

/// What a forward pass hands back.
pub enum Want<'o> {
    /// Only fill the KV cache (a prompt whose logits nobody reads).
    Nothing,
    /// Logits of the last token (`vocab_size` values).
    LastLogits(&'o mut [f32]),
    /// Logits of every token (`n × vocab_size`).
    AllLogits(&'o mut [f32]),
    /// Final hidden states after the final norm (`n × hidden_size`).
    Hidden(&'o mut [f32]),
}

pub struct Model<'w> {
    pub config: Config,
    pub weights: Weights<'w>,
    inv_freq: Vec<f32>,
    kernels: &'static Kernels,
}

impl<'w> Model<'w> {
    /// Checks every weight against `config` and picks the fastest kernels for this CPU.
    pub fn new(config: Config, weights: Weights<'w>) -> Result<Self> {
        weights.validate(&config)?;
        Ok(Model {
            inv_freq: config.rope_inv_freq(),
            config,
            weights,
            kernels: Kernels::best(),
        })
    }

    /// Uses `kernels` instead of the CPU's best (to compare the scalar reference, for example).
    pub fn with_kernels(mut self, kernels: &'static Kernels) -> Self {
        self.kernels = kernels;
        self
    }

    pub fn kernels(&self) -> &'static Kernels {
        self.kernels
    }

    /// Runs `tokens` at the positions after those already in `cache`, appends their K and V to
    /// it, and fills `want`. Inputs longer than the scratch's batch are processed in batches.
    pub fn forward<E: Exec + ?Sized>(
        &self,
        tokens: &[u32],
        cache: &mut KvCache<'_>,
        scratch: &mut Scratch<'_>,
        exec: &E,
        mut want: Want<'_>,
    ) -> Result<()> {
        let c = &self.config;
        let n = tokens.len();
        if let Some(&token) = tokens.iter().find(|t| **t as usize >= c.vocab_size) {
            return Err(Error::TokenOutOfRange {
                token,
                vocab: c.vocab_size,
            });
        }
        cache.check_shape(c)?;
        scratch.check_shape(c)?;
        cache.reserve(n)?;
        let expected = match &want {
            Want::Nothing => None,
            Want::LastLogits(o) => Some(("last logits", c.vocab_size, o.len())),
            Want::AllLogits(o) => Some(("all logits", n * c.vocab_size, o.len())),
            Want::Hidden(o) => Some(("hidden states", n * c.hidden_size, o.len())),
        };
        if let Some((what, expected, got)) = expected {
            if expected != got {
                return Err(Error::Length {
                    what,
                    expected,
                    got,
                });
            }
        }
        if n == 0 {
            return Ok(());
        }
        let mut result = Ok(());
        exec.run(&mut || result = self.forward_batches(tokens, cache, scratch, exec, &mut want));
        result
    }

    fn forward_batches<E: Exec + ?Sized>(
        &self,
        tokens: &[u32],
        cache: &mut KvCache<'_>,
        scratch: &mut Scratch<'_>,
        exec: &E,
        want: &mut Want<'_>,
    ) -> Result<()> {
        let c = &self.config;
        let n = tokens.len();
        let batch = scratch.max_batch;
        let mut start = 0;
        while start < n {
            let end = (start + batch).min(n);
            let part = match want {
                Want::Nothing => Want::Nothing,
                Want::LastLogits(o) if end == n => Want::LastLogits(o),
                Want::LastLogits(_) => Want::Nothing,
                Want::AllLogits(o) => {
                    Want::AllLogits(&mut o[start * c.vocab_size..end * c.vocab_size])
                }
                Want::Hidden(o) => Want::Hidden(&mut o[start * c.hidden_size..end * c.hidden_size]),
            };
            self.forward_batch(&tokens[start..end], cache, scratch, exec, part)?;
            start = end;
        }
        Ok(())
    }

    fn forward_batch<E: Exec + ?Sized>(
        &self,
        tokens: &[u32],
        cache: &mut KvCache<'_>,
        scratch: &mut Scratch<'_>,
        exec: &E,
        want: Want<'_>,
    ) -> Result<()> {
        let c = &self.config;
        let n = tokens.len();
        let pos0 = cache.len();
        let b = scratch.split();
        let Buffers {
            x,
            xb,
            q,
            k,
            v,
            att,
            gate,
            up,
            rope,
            tmp,
            q16,
        } = b;
        let (h, qd, kvd, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let (x, xb) = (&mut x[..n * h], &mut xb[..n * h]);
        let (q, k, v, att) = (
            &mut q[..n * qd],
            &mut k[..n * kvd],
            &mut v[..n * kvd],
            &mut att[..n * qd],
        );
        let (gate, up) = (&mut gate[..n * ff], &mut up[..n * ff]);
        let rope = &mut rope[..n * c.head_dim];
        let mut be = Cpu {
            kernels: self.kernels,
            exec,
            q16,
            tmp,
        };

        for (t, &token) in tokens.iter().enumerate() {
            self.weights
                .embed
                .dequantize_row(token as usize, &mut x[t * h..(t + 1) * h])?;
        }
        let half = c.head_dim / 2;
        for (t, a) in rope.chunks_exact_mut(c.head_dim).enumerate() {
            let (cos, sin) = a.split_at_mut(half);
            ops::rope_angles(pos0 + t, &self.inv_freq, cos, sin);
        }
        let shape = AttentionShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            window: c.sliding_window,
        };

        for (li, l) in self.weights.layers.iter().enumerate() {
            be.rms_norm(x, &l.attn_norm, c.rms_norm_eps, xb)?;
            be.matmul(
                xb,
                n,
                &[&l.wq, &l.wk, &l.wv],
                &mut [&mut *q, &mut *k, &mut *v],
            )?;
            for (buf, bias) in [(&mut *q, &l.bq), (&mut *k, &l.bk), (&mut *v, &l.bv)] {
                if let Some(bias) = bias {
                    be.add_bias(buf, bias)?;
                }
            }
            be.rope(q, n, rope, c.rope_style)?;
            be.rope(k, n, rope, c.rope_style)?;
            cache.store(self.kernels, li, pos0, k, v)?;
            be.attention(q, cache.layer(li), pos0, shape, att)?;
            be.matmul(att, n, &[&l.wo], &mut [&mut *xb])?;
            be.add(x, xb)?;

            be.rms_norm(x, &l.ffn_norm, c.rms_norm_eps, xb)?;
            be.matmul(xb, n, &[&l.w_gate, &l.w_up], &mut [&mut *gate, &mut *up])?;
            be.silu_mul(gate, up)?;
            be.matmul(gate, n, &[&l.w_down], &mut [&mut *xb])?;
            be.add(x, xb)?;
        }
        cache.advance(n);

        let norm = &self.weights.norm;
        let out_proj = self.weights.output();
        match want {
            Want::Nothing => {}
            Want::Hidden(out) => be.rms_norm(x, norm, c.rms_norm_eps, out)?,
            Want::LastLogits(out) => {
                let last = &mut xb[..h];
                be.rms_norm(&x[(n - 1) * h..], norm, c.rms_norm_eps, last)?;
                be.matmul(last, 1, &[out_proj], &mut [out])?;
            }
            Want::AllLogits(out) => {
                be.rms_norm(x, norm, c.rms_norm_eps, xb)?;
                let vocab = c.vocab_size;
                for (xs, o) in xb.chunks(TILE * h).zip(out.chunks_mut(TILE * vocab)) {
                    be.matmul(xs, xs.len() / h, &[out_proj], &mut [o])?;
                }
            }
        }
        Ok(())
    }
}

/// The mean over positions of `n × dim` hidden states: the embedding `sapient embed` prints.
pub fn mean_rows(hidden: &[f32], dim: usize, out: &mut [f32]) -> Result<()> {
    if dim == 0 || !hidden.len().is_multiple_of(dim) || out.len() != dim {
        return Err(Error::Length {
            what: "mean_rows",
            expected: dim,
            got: out.len(),
        });
    }
    let n = hidden.len() / dim;
    out.fill(0.0);
    for row in hidden.chunks_exact(dim) {
        ops::add(out, row)?;
    }
    if n > 0 {
        out.iter_mut().for_each(|v| *v /= n as f32);
    }
    Ok(())
}
