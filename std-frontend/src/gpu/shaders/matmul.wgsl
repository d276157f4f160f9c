// Mat-vec and tiled mat-mat over one part of a weight matrix, with the layer loop's fusions:
// an RMSNorm of the inputs (NORM), and an epilogue that stores (plus a bias), adds into the
// residual stream, or multiplies SiLU(gate) by up for interleaved gate/up rows (EPI). The Rust
// side prepends the constants ROWS, LANES, THREAD_ROWS, TOK, NORM, NORM_AFTER, BIAS, EPI and the
// format's functions, and compiles the lines above the first section with one section: `float`
// (f32 inputs; `quantize` too) or, for integer weights where WGSL has `dot4I8Packed`, `q16`.
//
// A workgroup computes ROWS rows for TOK tokens; LANES threads share THREAD_ROWS rows, each
// striding over their 32-value blocks, then the lanes' sums are added in a tree.
//
// Integer weights meet activations quantized as the CPU's `quant::q16` does (d = amax / 32639,
// quants rounded to nearest even; the block keeps the sum of each half's quants): in a batch, one `quantize` dispatch makes the
// blocks for every row of the mat-mul; a lone token's mat-vec makes each block as it reads it,
// once for the THREAD_ROWS rows of a thread. The blocks, and the order their products are
// added in, are the same either way, so a token gets the same bits alone and in a batch.

struct Rows { first: u32, count: u32, splits: u32, pad: u32 }
struct Mat {
    rows: u32, cols: u32, out_row0: u32, x_stride: u32,
    out_stride: u32, d_off: u32, m_off: u32, bias_off: u32,
    eps: f32, nb: u32, pad0: u32, pad1: u32,
}

@group(0) @binding(0) var<uniform> batch: Rows;
@group(0) @binding(1) var<uniform> p: Mat;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<storage, read> aux: array<f32>;

const WG: u32 = ROWS * LANES / THREAD_ROWS;
const EPI_STORE: u32 = 0u;
const EPI_ADD: u32 = 1u;
const EPI_SWIGLU: u32 = 2u;
// Words of a Q16 block: each quant is 256·hi + lo with both halves in i8, so that two packed
// 8-bit dot products take it; 8 words of `hi` bytes, 8 of `lo` bytes, then d and the sums of
// the quants of values 0..16 and 16..32 (i32; a format with a minimum per half needs both).
const Q16_WORDS: u32 = 19u;
const Q16_MAX: f32 = 32639.0;

var<workgroup> red: array<f32, ROWS * LANES * TOK>;
var<workgroup> inv_rms: array<f32, TOK>;

fn silu(v: f32) -> f32 {
    return v / (1.0 + exp(-v));
}

// inv_rms[t] ← 1/RMS of the row of each token of the tile.
fn norm_prologue(lid: u32, tok_base: u32, tok_end: u32) {
    for (var t = 0u; t < TOK; t++) {
        var ss = 0.0;
        if (tok_base + t < tok_end) {
            for (var c = lid; c < p.cols; c += WG) {
                let v = x[(tok_base + t) * p.x_stride + c];
                ss += v * v;
            }
        }
        red[lid * TOK + t] = ss;
    }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            for (var t = 0u; t < TOK; t++) {
                red[lid * TOK + t] += red[(lid + s) * TOK + t];
            }
        }
        workgroupBarrier();
    }
    if (lid < TOK) {
        inv_rms[lid] = 1.0 / sqrt(red[lid] / f32(p.cols) + p.eps);
    }
    workgroupBarrier();
}

// Block `b` of token `tok`'s inputs (RMSNorm'd by `inv` and the norm's weights when NORM) as a
// Q16 block.
fn q16_block(tok: u32, b: u32, inv: f32) -> array<u32, Q16_WORDS> {
    let i = tok * p.x_stride + b * 32u;
    var v: array<f32, 32>;
    var amax = 0.0;
    for (var k = 0u; k < 32u; k++) {
        var e = x[i + k];
        if (NORM) {
            e = e * inv * aux[b * 32u + k];
        }
        v[k] = e;
        amax = max(amax, abs(e));
    }
    let d = amax / Q16_MAX;
    let id = select(0.0, 1.0 / d, d != 0.0);
    var out: array<u32, Q16_WORDS>;
    var sum0 = 0i;
    var sum1 = 0i;
    for (var j = 0u; j < 8u; j++) {
        var hi = 0u;
        var lo = 0u;
        for (var k = 0u; k < 4u; k++) {
            let q = i32(round(clamp(v[j * 4u + k] * id, -Q16_MAX, Q16_MAX)));
            if (j < 4u) {
                sum0 += q;
            } else {
                sum1 += q;
            }
            let h = (q + 128i) >> 8u;
            hi |= (u32(h) & 0xffu) << (8u * k);
            lo |= (u32(q - h * 256i) & 0xffu) << (8u * k);
        }
        out[j] = hi;
        out[8u + j] = lo;
    }
    out[16u] = bitcast<u32>(d);
    out[17u] = bitcast<u32>(sum0);
    out[18u] = bitcast<u32>(sum1);
    return out;
}

// Adds the lanes' sums `acc` of each of the thread's rows (then token).
fn add_lanes(lid: u32, acc: array<f32, THREAD_ROWS * TOK>) {
    let lane = lid % LANES;
    let rr0 = (lid / LANES) * THREAD_ROWS;
    for (var i = 0u; i < THREAD_ROWS; i++) {
        for (var t = 0u; t < TOK; t++) {
            red[((rr0 + i) * LANES + lane) * TOK + t] = acc[i * TOK + t];
        }
    }
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            for (var i = 0u; i < THREAD_ROWS; i++) {
                for (var t = 0u; t < TOK; t++) {
                    let k = ((rr0 + i) * LANES + lane) * TOK + t;
                    red[k] += red[k + s * TOK];
                }
            }
        }
        workgroupBarrier();
    }
}

fn result(rr: u32, t: u32) -> f32 {
    return red[rr * LANES * TOK + t];
}

// The epilogue, for the sum `result(rr, t)` of each row and token of the tile.
fn epilogue(lid: u32, row_base: u32, tok_base: u32, tok_end: u32) {
    for (var i = lid; i < ROWS * TOK; i += WG) {
        let rr = i / TOK;
        let t = i % TOK;
        let out_row = row_base + rr;
        let tok = tok_base + t;
        if (out_row < p.rows && tok < tok_end) {
            var v = result(rr, t);
            if (NORM_AFTER) {
                v *= inv_rms[t];
            }
            let o = (tok - batch.first) * p.out_stride;
            if (EPI == EPI_STORE) {
                if (BIAS) {
                    v += aux[p.bias_off + p.out_row0 + out_row];
                }
                y[o + p.out_row0 + out_row] = v;
            } else if (EPI == EPI_ADD) {
                y[o + p.out_row0 + out_row] += v;
            } else if (rr % 2u == 0u) {
                // Rows come as (gate, up) pairs.
                var u = result(rr + 1u, t);
                if (NORM_AFTER) {
                    u *= inv_rms[t];
                }
                y[o + (p.out_row0 + out_row) / 2u] = silu(v) * u;
            }
        }
    }
}

//#float
// Four consecutive inputs of token `t` from column `c`, zero past the last column.
fn load_x(t: u32, c: u32) -> vec4<f32> {
    let i = t * p.x_stride + c;
    var v = vec4<f32>(0.0);
    for (var k = 0u; k < 4u; k++) {
        if (c + k < p.cols) {
            v[k] = x[i + k];
        }
    }
    return v;
}

fn norm_weight(c: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var k = 0u; k < 4u; k++) {
        if (c + k < p.cols) {
            v[k] = aux[c + k];
        }
    }
    return v;
}

@compute @workgroup_size(WG)
fn matmul(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let row_base = (wid.x + wid.y * nwg.x) * ROWS;
    let tok_base = batch.first + wid.z * TOK;
    let tok_end = batch.first + batch.count;
    if (NORM) {
        norm_prologue(lid, tok_base, tok_end);
    }

    let row = row_base + lid / LANES;
    var acc: array<f32, THREAD_ROWS * TOK>;
    if (row < p.rows) {
        for (var b = lid % LANES; b < p.nb; b += LANES) {
            for (var j = 0u; j < 8u; j++) {
                let c = b * 32u + j * 4u;
                let wv = deq(row, b, j);
                var g = vec4<f32>(1.0);
                if (NORM) {
                    g = norm_weight(c);
                }
                for (var t = 0u; t < TOK; t++) {
                    if (tok_base + t < tok_end) {
                        acc[t] += dot(wv, load_x(tok_base + t, c) * g);
                    }
                }
            }
        }
    }
    add_lanes(lid, acc);
    epilogue(lid, row_base, tok_base, tok_end);
}

@group(0) @binding(6) var<storage, read> tokens: array<u32>;

// X rows ← the embedding rows of the batch's tokens that lie in this part.
@compute @workgroup_size(64)
fn embed(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x * 4u;
    let t = gid.y;
    if (c >= p.cols || t >= batch.count) {
        return;
    }
    let id = tokens[t];
    if (id < p.out_row0 || id >= p.out_row0 + p.rows) {
        return;
    }
    let v = deq(id - p.out_row0, c / 32u, (c % 32u) / 4u);
    for (var k = 0u; k < 4u; k++) {
        if (c + k < p.cols) {
            y[t * p.out_stride + c + k] = v[k];
        }
    }
}

@group(0) @binding(7) var<storage, read_write> q16_out: array<u32>;

// The batch's rows of inputs as Q16 blocks: one workgroup per token.
@compute @workgroup_size(WG)
fn quantize(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let tok = batch.first + wid.y;
    if (NORM) {
        norm_prologue(lid, tok, tok + 1u);
    }
    for (var b = lid; b < p.nb; b += WG) {
        let q = q16_block(tok, b, inv_rms[0]);
        let o = (tok * p.nb + b) * Q16_WORDS;
        for (var k = 0u; k < Q16_WORDS; k++) {
            q16_out[o + k] = q[k];
        }
    }
}

//#q16
// Integer weights against Q16 inputs: per block, the quants' exact dot product in two packed
// 8-bit ones per word (`dot4I8Packed`: one instruction where the GPU has one), then the scales.
@group(0) @binding(7) var<storage, read> q16_in: array<u32>;

// The dot product of block `b` of `row`'s weights and a Q16 block.
fn block_dot(row: u32, b: u32, q: array<u32, Q16_WORDS>) -> f32 {
    var hi = vec2<i32>();
    var lo = vec2<i32>();
    for (var j = 0u; j < 4u; j++) {
        let w0 = qword(row, b, j);
        let w1 = qword(row, b, j + 4u);
        hi += vec2<i32>(dot4I8Packed(w0, q[j]), dot4I8Packed(w1, q[j + 4u]));
        lo += vec2<i32>(dot4I8Packed(w0, q[8u + j]), dot4I8Packed(w1, q[12u + j]));
    }
    let xsum = vec2<i32>(bitcast<i32>(q[17u]), bitcast<i32>(q[18u]));
    return qdot(row, b, hi * 256i + lo, bitcast<f32>(q[16u]), xsum);
}

// A tile of tokens whose Q16 blocks `quantize` made.
@compute @workgroup_size(WG)
fn matmul(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let row_base = (wid.x + wid.y * nwg.x) * ROWS;
    let tok_base = batch.first + wid.z * TOK;
    let tok_end = batch.first + batch.count;
    let row0 = row_base + (lid / LANES) * THREAD_ROWS;
    var acc: array<f32, THREAD_ROWS * TOK>;
    for (var b = lid % LANES; b < p.nb; b += LANES) {
        for (var t = 0u; t < TOK; t++) {
            let tok = tok_base + t;
            if (tok < tok_end) {
                var q: array<u32, Q16_WORDS>;
                let o = (tok * p.nb + b) * Q16_WORDS;
                for (var k = 0u; k < Q16_WORDS; k++) {
                    q[k] = q16_in[o + k];
                }
                for (var i = 0u; i < THREAD_ROWS; i++) {
                    if (row0 + i < p.rows) {
                        acc[i * TOK + t] += block_dot(row0 + i, b, q);
                    }
                }
            }
        }
    }
    add_lanes(lid, acc);
    epilogue(lid, row_base, tok_base, tok_end);
}

// One token, each block of its inputs quantized as it is read.
@compute @workgroup_size(WG)
fn matvec(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let row_base = (wid.x + wid.y * nwg.x) * ROWS;
    let tok = batch.first;
    if (NORM) {
        norm_prologue(lid, tok, tok + 1u);
    }
    let row0 = row_base + (lid / LANES) * THREAD_ROWS;
    var acc: array<f32, THREAD_ROWS * TOK>;
    for (var b = lid % LANES; b < p.nb; b += LANES) {
        let q = q16_block(tok, b, inv_rms[0]);
        for (var i = 0u; i < THREAD_ROWS; i++) {
            if (row0 + i < p.rows) {
                acc[i] += block_dot(row0 + i, b, q);
            }
        }
    }
    add_lanes(lid, acc);
    epilogue(lid, row_base, tok, tok + 1u);
}
