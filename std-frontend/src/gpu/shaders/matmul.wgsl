// Mat-vec and tiled mat-mat over one part of a weight matrix, with the layer loop's fusions:
// an RMSNorm of the inputs (NORM), and an epilogue that stores (plus a bias), adds into the
// residual stream, multiplies SiLU(gate) by up for interleaved gate/up rows, or (Q|K|V, plus a
// bias) rotates Q and K by RoPE and stores K and V in the layer's KV cache (EPI). The Rust side
// prepends the constants ROWS, LANES, TOK, THREADS, RED_LEN, RED_STRIDE, NORM, NORM_AFTER, BIAS,
// EPI and the format's functions, and compiles the lines above the first section with one
// section: `float` (f32 inputs; `quantize` too) or, for integer weights where WGSL has
// `dot4I8Packed`, `q16`; and with `rope` (after the type it writes K and V in, `Kv`, and
// KV_STAGED) for Q|K|V's epilogue or `no_rope` for the others.
//
// A workgroup computes ROWS rows for TOK tokens. A row's sum over its 32-value blocks has one
// order everywhere: LANES running sums, the l-th over blocks l, l + LANES, ... in turn, then
// those added in a tree (`add_lanes`). Most kernels give each of their LANES threads one running
// sum of every row and token; the Q16 tile gives a thread eight of them, for its few rows and
// tokens, and adds them as the tree's three lowest levels would.
//
// Integer weights meet activations quantized as the CPU's `quant::q16` does (d = amax / 32639,
// quants rounded to nearest even; the block keeps the sum of each half's quants): in a batch,
// one `quantize` dispatch makes the blocks for every row of the mat-mul; a lone token's mat-vec
// makes each block as it reads it, once for the workgroup's ROWS rows. The blocks, and the order
// their products are added in, are the same either way, so a token gets the same bits alone and
// in a batch.

struct Rows { first: u32, count: u32, splits: u32, pad: u32 }
struct Mat {
    rows: u32, cols: u32, out_row0: u32, x_stride: u32,
    out_stride: u32, d_off: u32, m_off: u32, bias_off: u32,
    eps: f32, nb: u32, head_dim: u32, q_dim: u32,
    kv_dim: u32, rope_adjacent: u32, pad0: u32, pad1: u32,
}

@group(0) @binding(0) var<uniform> batch: Rows;
@group(0) @binding(1) var<uniform> p: Mat;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<storage, read> aux: array<f32>;

const EPI_STORE: u32 = 0u;
const EPI_ADD: u32 = 1u;
const EPI_SWIGLU: u32 = 2u;
const EPI_ROPE: u32 = 3u;
// Words of a Q16 block: each quant is 256·hi + lo with both halves in i8, so that two packed
// 8-bit dot products take it; 8 words of `hi` bytes, 8 of `lo` bytes, then d and the sums of
// the quants of values 0..16 and 16..32 (i32; a format with a minimum per half needs both).
const Q16_WORDS: u32 = 19u;
const Q16_MAX: f32 = 32639.0;

var<workgroup> red: array<f32, RED_LEN>;
var<workgroup> inv_rms: array<f32, TOK>;

fn silu(v: f32) -> f32 {
    return v / (1.0 + exp(-v));
}

// inv_rms[t] ← 1/RMS of the row of each token of the tile.
fn norm_prologue(lid: u32, tok_base: u32, tok_end: u32) {
    for (var t = 0u; t < TOK; t++) {
        var ss = 0.0;
        if (tok_base + t < tok_end) {
            for (var c = lid; c < p.cols; c += LANES) {
                let v = x[(tok_base + t) * p.x_stride + c];
                ss += v * v;
            }
        }
        red[lid * TOK + t] = ss;
    }
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s >>= 1u) {
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

// A Q16 block of inputs, in registers: the high bytes of the quants of values 0..16 (`hi0`, four
// to a word) and 16..32 (`hi1`), the low bytes likewise, the scale, and each half's quant sum.
// (Held in arrays and copied between functions, as before, they cost an H200 4-5x in prefill.)
struct Q16 {
    hi0: vec4<u32>,
    hi1: vec4<u32>,
    lo0: vec4<u32>,
    lo1: vec4<u32>,
    d: f32,
    sum0: i32,
    sum1: i32,
}

// Inputs c .. c+3 of the row at `i` (RMSNorm'd by `inv` and the norm's weights when NORM).
fn inputs4(i: u32, c: u32, inv: f32) -> vec4<f32> {
    var v = vec4<f32>(x[i], x[i + 1u], x[i + 2u], x[i + 3u]);
    if (NORM) {
        v = v * inv * vec4<f32>(aux[c], aux[c + 1u], aux[c + 2u], aux[c + 3u]);
    }
    return v;
}

// Four values' quants, rounded to nearest even as the CPU's `quant::q16` does.
fn quants4(v: vec4<f32>, id: f32) -> vec4<i32> {
    return vec4<i32>(round(clamp(v * id, vec4<f32>(-Q16_MAX), vec4<f32>(Q16_MAX))));
}

// Four signed bytes in a word, the first lowest.
fn bytes_word(b: vec4<i32>) -> u32 {
    let u = vec4<u32>(b) & vec4<u32>(0xffu);
    return u.x | (u.y << 8u) | (u.z << 16u) | (u.w << 24u);
}

// The high bytes (q + 128) >> 8 of four quants, and the low ones, q - 256·high: both signed.
fn high_word(q: vec4<i32>) -> u32 {
    return bytes_word((q + vec4<i32>(128)) >> vec4<u32>(8u));
}

fn low_word(q: vec4<i32>) -> u32 {
    return bytes_word(q - ((q + vec4<i32>(128)) >> vec4<u32>(8u)) * 256i);
}

fn sum4(q: vec4<i32>) -> i32 {
    return q.x + q.y + q.z + q.w;
}

// Block `b` of token `tok`'s inputs (RMSNorm'd by `inv` and the norm's weights when NORM) as a
// Q16 block.
fn q16_block(tok: u32, b: u32, inv: f32) -> Q16 {
    let i = tok * p.x_stride + b * 32u;
    let c = b * 32u;
    let v0 = inputs4(i, c, inv);
    let v1 = inputs4(i + 4u, c + 4u, inv);
    let v2 = inputs4(i + 8u, c + 8u, inv);
    let v3 = inputs4(i + 12u, c + 12u, inv);
    let v4 = inputs4(i + 16u, c + 16u, inv);
    let v5 = inputs4(i + 20u, c + 20u, inv);
    let v6 = inputs4(i + 24u, c + 24u, inv);
    let v7 = inputs4(i + 28u, c + 28u, inv);
    let m = max(
        max(max(abs(v0), abs(v1)), max(abs(v2), abs(v3))),
        max(max(abs(v4), abs(v5)), max(abs(v6), abs(v7)))
    );
    let d = max(max(m.x, m.y), max(m.z, m.w)) / Q16_MAX;
    let id = select(0.0, 1.0 / d, d != 0.0);
    let q0 = quants4(v0, id);
    let q1 = quants4(v1, id);
    let q2 = quants4(v2, id);
    let q3 = quants4(v3, id);
    let q4 = quants4(v4, id);
    let q5 = quants4(v5, id);
    let q6 = quants4(v6, id);
    let q7 = quants4(v7, id);
    return Q16(
        vec4<u32>(high_word(q0), high_word(q1), high_word(q2), high_word(q3)),
        vec4<u32>(high_word(q4), high_word(q5), high_word(q6), high_word(q7)),
        vec4<u32>(low_word(q0), low_word(q1), low_word(q2), low_word(q3)),
        vec4<u32>(low_word(q4), low_word(q5), low_word(q6), low_word(q7)),
        d,
        sum4(q0) + sum4(q1) + sum4(q2) + sum4(q3),
        sum4(q4) + sum4(q5) + sum4(q6) + sum4(q7),
    );
}

// Adds the threads' sums `acc` of each row (then token).
fn add_lanes(lid: u32, acc: array<f32, ROWS * TOK>) {
    for (var i = 0u; i < ROWS; i++) {
        for (var t = 0u; t < TOK; t++) {
            red[(i * LANES + lid) * TOK + t] = acc[i * TOK + t];
        }
    }
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            for (var i = 0u; i < ROWS; i++) {
                for (var t = 0u; t < TOK; t++) {
                    let k = (i * LANES + lid) * TOK + t;
                    red[k] += red[k + s * TOK];
                }
            }
        }
        workgroupBarrier();
    }
}

fn result(rr: u32, t: u32) -> f32 {
    return red[rr * RED_STRIDE + t];
}

// Row `rr`'s sum for token `t` of the tile, times 1/RMS where the norm comes after the sum.
fn normed(rr: u32, t: u32) -> f32 {
    var v = result(rr, t);
    if (NORM_AFTER) {
        v *= inv_rms[t];
    }
    return v;
}

// `v` plus the bias of row `row` of the matrix, where it has biases.
fn biased(v: f32, row: u32) -> f32 {
    if (BIAS) {
        return v + aux[p.bias_off + row];
    }
    return v;
}

// The epilogue, for the sum `result(rr, t)` of each row and token of the tile.
fn epilogue(lid: u32, row_base: u32, tok_base: u32, tok_end: u32) {
    for (var i = lid; i < ROWS * TOK; i += THREADS) {
        let rr = i / TOK;
        let t = i % TOK;
        let out_row = row_base + rr;
        let tok = tok_base + t;
        if (out_row < p.rows && tok < tok_end) {
            let v = normed(rr, t);
            let o = (tok - batch.first) * p.out_stride;
            let row = p.out_row0 + out_row;
            if (EPI == EPI_STORE) {
                y[o + row] = biased(v, row);
            } else if (EPI == EPI_ADD) {
                y[o + row] += v;
            } else if (rr % 2u == 0u) {
                // Rows come in pairs: (gate, up), or the two values RoPE rotates together (parts
                // and workgroups hold whole pairs).
                let u = normed(rr + 1u, t);
                if (EPI == EPI_SWIGLU) {
                    y[o + row / 2u] = silu(v) * u;
                } else {
                    rope_store(row, tok, o, biased(v, row), biased(u, row + 1u));
                }
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

@compute @workgroup_size(LANES)
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

    var acc: array<f32, ROWS * TOK>;
    for (var b = lid; b < p.nb; b += LANES) {
        for (var j = 0u; j < 8u; j++) {
            let c = b * 32u + j * 4u;
            var g = vec4<f32>(1.0);
            if (NORM) {
                g = norm_weight(c);
            }
            for (var i = 0u; i < ROWS; i++) {
                if (row_base + i < p.rows) {
                    let wv = deq(row_base + i, b, j);
                    for (var t = 0u; t < TOK; t++) {
                        if (tok_base + t < tok_end) {
                            acc[i * TOK + t] += dot(wv, load_x(tok_base + t, c) * g);
                        }
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

fn store4(o: u32, v: vec4<u32>) {
    q16_out[o] = v.x;
    q16_out[o + 1u] = v.y;
    q16_out[o + 2u] = v.z;
    q16_out[o + 3u] = v.w;
}

// The batch's rows of inputs as Q16 blocks: one workgroup per token.
@compute @workgroup_size(LANES)
fn quantize(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let tok = batch.first + wid.y;
    if (NORM) {
        norm_prologue(lid, tok, tok + 1u);
    }
    for (var b = lid; b < p.nb; b += LANES) {
        let q = q16_block(tok, b, inv_rms[0]);
        let o = (tok * p.nb + b) * Q16_WORDS;
        store4(o, q.hi0);
        store4(o + 4u, q.hi1);
        store4(o + 8u, q.lo0);
        store4(o + 12u, q.lo1);
        q16_out[o + 16u] = bitcast<u32>(q.d);
        q16_out[o + 17u] = bitcast<u32>(q.sum0);
        q16_out[o + 18u] = bitcast<u32>(q.sum1);
    }
}

//#q16
// Integer weights against Q16 inputs: per block, the quants' exact dot product in two packed
// 8-bit ones per word (`dot4I8Packed`: one instruction where the GPU has one), then the scales.
// Compiled with one of the two sections below it: a batch's tile or a lone token's mat-vec.

// The dot product of block `b` of `row`'s weights and a Q16 block.
fn block_dot(row: u32, b: u32, q: Q16) -> f32 {
    let w0 = vec4<u32>(qword(row, b, 0u), qword(row, b, 1u), qword(row, b, 2u), qword(row, b, 3u));
    let w1 = vec4<u32>(qword(row, b, 4u), qword(row, b, 5u), qword(row, b, 6u), qword(row, b, 7u));
    let hi = vec2<i32>(dot4(w0, q.hi0), dot4(w1, q.hi1));
    let lo = vec2<i32>(dot4(w0, q.lo0), dot4(w1, q.lo1));
    return qdot(row, b, hi * 256i + lo, q.d, vec2<i32>(q.sum0, q.sum1));
}

// The integer dot product of 16 signed bytes, four to a word.
fn dot4(w: vec4<u32>, q: vec4<u32>) -> i32 {
    return dot4I8Packed(w.x, q.x) + dot4I8Packed(w.y, q.y) + dot4I8Packed(w.z, q.z)
        + dot4I8Packed(w.w, q.w);
}

//#q16_tile
// A batch's tile over the Q16 blocks that `quantize` made.
@group(0) @binding(7) var<storage, read> q16_in: array<u32>;

// The Q16 block at word `o` of what `quantize` wrote.
fn load_q16(o: u32) -> Q16 {
    return Q16(
        vec4<u32>(q16_in[o], q16_in[o + 1u], q16_in[o + 2u], q16_in[o + 3u]),
        vec4<u32>(q16_in[o + 4u], q16_in[o + 5u], q16_in[o + 6u], q16_in[o + 7u]),
        vec4<u32>(q16_in[o + 8u], q16_in[o + 9u], q16_in[o + 10u], q16_in[o + 11u]),
        vec4<u32>(q16_in[o + 12u], q16_in[o + 13u], q16_in[o + 14u], q16_in[o + 15u]),
        bitcast<f32>(q16_in[o + 16u]),
        bitcast<i32>(q16_in[o + 17u]),
        bitcast<i32>(q16_in[o + 18u]),
    );
}

// The Q16 tile: THREADS threads, eight to each group of 4 rows × NT tokens. Thread g of a group
// keeps the running sums l = g, g + 8, ..., g + 56 of its rows and tokens, one after another, and
// adds them as the tree's three lowest levels do (sum l meets l + 32, then l + 16's pair, then
// l + 8's four); the eight threads' subtrees are then added as its last three levels. Its sums
// live in registers, not in the workgroup's memory, and no thread idles on a short row.
const ROW_GROUPS: u32 = ROWS / 4u;

// The running sum of class `l` (blocks l, l + LANES, ...) of 4 rows from `row0` for each of NT
// tokens from `tok0`: part[i * NT + t]. (Each product is added as the mat-vec adds it, so that
// a GPU compiler contracts the same multiplies and adds in both.)
var<private> part: array<f32, 4 * NT>;

fn class_sums(l: u32, row0: u32, tok0: u32, tok_end: u32) {
    for (var k = 0u; k < 4u * NT; k++) {
        part[k] = 0.0;
    }
    for (var b = l; b < p.nb; b += LANES) {
        for (var t = 0u; t < NT; t++) {
            if (tok0 + t < tok_end) {
                let q = load_q16(((tok0 + t) * p.nb + b) * Q16_WORDS);
                for (var i = 0u; i < 4u; i++) {
                    if (row0 + i < p.rows) {
                        part[i * NT + t] += block_dot(row0 + i, b, q);
                    }
                }
            }
        }
    }
}

// pair ← the running sums l and l + 32 added: the tree's lowest level.
var<private> pair: array<f32, 4 * NT>;

fn pair_sums(l: u32, row0: u32, tok0: u32, tok_end: u32) {
    class_sums(l, row0, tok0, tok_end);
    pair = part;
    class_sums(l + 32u, row0, tok0, tok_end);
    for (var k = 0u; k < 4u * NT; k++) {
        pair[k] += part[k];
    }
}

@compute @workgroup_size(THREADS)
fn matmul(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let row_base = (wid.x + wid.y * nwg.x) * ROWS;
    let tok_base = batch.first + wid.z * TOK;
    let tok_end = batch.first + batch.count;
    let g = lid % 8u;
    let rr0 = (lid / 8u) % ROW_GROUPS * 4u;
    let t0 = (lid / 8u) / ROW_GROUPS * NT;
    let row0 = row_base + rr0;
    let tok0 = tok_base + t0;

    // The subtree over sums g, g + 32, g + 16, g + 48, g + 8, g + 40, g + 24, g + 56.
    var s: array<f32, 4 * NT>;
    var s2: array<f32, 4 * NT>;
    pair_sums(g, row0, tok0, tok_end);
    s = pair;
    pair_sums(g + 16u, row0, tok0, tok_end);
    for (var k = 0u; k < 4u * NT; k++) {
        s[k] += pair[k];
    }
    pair_sums(g + 8u, row0, tok0, tok_end);
    s2 = pair;
    pair_sums(g + 24u, row0, tok0, tok_end);
    for (var k = 0u; k < 4u * NT; k++) {
        s[k] += s2[k] + pair[k];
    }

    // red[g][row][token]; the threads' subtrees are added into g = 0, which `result` reads.
    for (var i = 0u; i < 4u; i++) {
        for (var t = 0u; t < NT; t++) {
            red[(g * ROWS + rr0 + i) * TOK + t0 + t] = s[i * NT + t];
        }
    }
    workgroupBarrier();
    for (var span = 4u; span > 0u; span >>= 1u) {
        if (g < span) {
            for (var i = 0u; i < 4u; i++) {
                for (var t = 0u; t < NT; t++) {
                    let k = (g * ROWS + rr0 + i) * TOK + t0 + t;
                    red[k] += red[k + span * ROWS * TOK];
                }
            }
        }
        workgroupBarrier();
    }
    epilogue(lid, row_base, tok_base, tok_end);
}

//#q16_vec
// One token, each block of its inputs quantized as it is read.
@compute @workgroup_size(LANES)
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
    var acc: array<f32, ROWS * TOK>;
    for (var b = lid; b < p.nb; b += LANES) {
        let q = q16_block(tok, b, inv_rms[0]);
        for (var i = 0u; i < ROWS; i++) {
            if (row_base + i < p.rows) {
                acc[i] += block_dot(row_base + i, b, q);
            }
        }
    }
    add_lanes(lid, acc);
    epilogue(lid, row_base, tok, tok + 1u);
}

//#rope
// Q|K|V's epilogue: RoPE on Q (stored in its own rows) and K, then K and V into the layer's
// cache, at the place of the batch's row (or, KV_STAGED, into f32 rows for `kv_store`).
struct Place { kv_row0: u32, pos: u32 }

@group(0) @binding(8) var<storage, read> angles: array<f32>;
@group(0) @binding(9) var<storage, read_write> k_cache: array<Kv>;
@group(0) @binding(10) var<storage, read_write> v_cache: array<Kv>;
@group(0) @binding(11) var<storage, read> places: array<Place>;

// Rows `row` and `row + 1` of Q|K|V (`row` even), values `v0` and `v1`, of the batch's row `tok`
// (its outputs from `o`). The upload made each RoPE pair two neighbouring rows: dimensions
// (2j, 2j + 1) of a head as they are, or (j, j + head_dim / 2) where RoPE rotates halves.
fn rope_store(row: u32, tok: u32, o: u32, v0: f32, v1: f32) {
    let hd = p.head_dim;
    let pos = places[tok].pos;
    // A Q8_0 cache's K and V go to rows of f32, one per batch row, that `kv_store` quantizes.
    var cached = (places[tok].kv_row0 + pos) * p.kv_dim;
    if (KV_STAGED) {
        cached = tok * p.kv_dim;
    }
    if (row >= p.q_dim + p.kv_dim) {
        let e = row - p.q_dim - p.kv_dim;
        v_cache[cached + e] = Kv(v0);
        v_cache[cached + e + 1u] = Kv(v1);
        return;
    }
    let half = hd / 2u;
    let j = (row % hd) / 2u;
    var a = row;
    var b = row + 1u;
    if (p.rope_adjacent == 0u) {
        a = row - row % hd + j;
        b = a + half;
    }
    let c = angles[pos * hd + j];
    let s = angles[pos * hd + half + j];
    let r0 = v0 * c - v1 * s;
    let r1 = v1 * c + v0 * s;
    if (row < p.q_dim) {
        y[o + a] = r0;
        y[o + b] = r1;
    } else {
        // K heads follow the Q heads in the rows; in the cache they start at 0.
        k_cache[cached + a - p.q_dim] = Kv(r0);
        k_cache[cached + b - p.q_dim] = Kv(r1);
    }
}

//#no_rope
// The other mat-muls' epilogues never call it.
fn rope_store(row: u32, tok: u32, o: u32, v0: f32, v1: f32) {}
