// The layer loop's steps that are not mat-muls (RoPE and the KV store are Q|K|V's epilogue, in
// matmul.wgsl): attention (one query head of one token per workgroup, an online softmax over the
// cached keys, optionally split over the context and combined by `attention_reduce`), the
// quantizer of a Q8_0 cache's new rows, the final RMSNorm, and greedy argmax. Each `//#name`
// section is compiled with the lines above the first section, as its own module; those that
// touch the KV cache get the type of its elements, `Kv` (f32, f16, or u32 words of Q8_0 blocks),
// first, and attention the section that reads its values (`kv_float` or `kv_q8_0`) after.

struct Rows { first: u32, count: u32, splits: u32, pad: u32 }
// Where a row of the batch sits: the first cache row of its sequence's KV slot, and its position.
struct Place { kv_row0: u32, pos: u32 }
struct Shape {
    n_heads: u32, n_kv_heads: u32, head_dim: u32, window: u32,
    q_dim: u32, kv_dim: u32, scale: f32, hidden: u32,
    eps: f32, vocab: u32, pad0: u32, pad1: u32,
}

@group(0) @binding(0) var<uniform> batch: Rows;
@group(0) @binding(1) var<uniform> sh: Shape;

// Below every score: a maximum that has seen nothing yet.
const NEG: f32 = -3.0e38;
// Words of a Q8_0 block in a KV cache: 8 of quants (four to a word, the first lowest), then the
// scale's f16 bits.
const Q8_WORDS: u32 = 9u;

//#attention
// Attention.
@group(0) @binding(2) var<storage, read> q_rows: array<f32>;
@group(0) @binding(3) var<storage, read> k_read: array<Kv>;
@group(0) @binding(4) var<storage, read> v_read: array<Kv>;
@group(0) @binding(5) var<storage, read_write> att: array<f32>;
// Per (head, split) of a decoded token: the weighted value sum, then its maximum and sum.
@group(0) @binding(6) var<storage, read_write> partial: array<f32>;
@group(0) @binding(7) var<storage, read> places: array<Place>;

const KEYS: u32 = 64u;
const MAX_DIMS: u32 = 8u; // head_dim / KEYS, at most 512 / 64

var<workgroup> q_s: array<f32, 512>;
var<workgroup> p_s: array<f32, KEYS>;
var<workgroup> m_s: array<f32, KEYS>;

@compute @workgroup_size(KEYS)
fn attention(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
    let t = wid.y;
    let split = wid.z;
    let hd = sh.head_dim;
    let kvh = h / (sh.n_heads / sh.n_kv_heads);
    let pos = places[t].pos;
    let kv_row0 = places[t].kv_row0;
    var lo = 0u;
    if (sh.window > 0u && pos + 1u > sh.window) {
        lo = pos + 1u - sh.window;
    }
    let hi = pos + 1u;
    let per = ((hi - lo + batch.splits - 1u) / batch.splits + KEYS - 1u) / KEYS * KEYS;
    let a = min(lo + split * per, hi);
    let b = min(a + per, hi);

    for (var d = lid; d < hd; d += KEYS) {
        q_s[d] = q_rows[t * sh.q_dim + h * hd + d];
    }
    workgroupBarrier();

    var m = NEG;
    var l = 0.0;
    var acc: array<f32, MAX_DIMS>;
    for (var c0 = a; c0 < b; c0 += KEYS) {
        let j = c0 + lid;
        var score = NEG;
        if (j < b) {
            let k = (kv_row0 + j) * sh.kv_dim + kvh * hd;
            // Four loads issued before their sums (added in the same order): a loop that waits
            // on each load ran a step of keys at ~60 µs on an H200.
            var s = 0.0;
            var d = 0u;
            for (; d + 4u <= hd; d += 4u) {
                let kd = key4(k + d);
                s += q_s[d] * kd.x;
                s += q_s[d + 1u] * kd.y;
                s += q_s[d + 2u] * kd.z;
                s += q_s[d + 3u] * kd.w;
            }
            for (; d < hd; d++) {
                s += q_s[d] * key(k + d);
            }
            score = s * sh.scale;
        }
        m_s[lid] = score;
        workgroupBarrier();
        for (var s = KEYS / 2u; s > 0u; s >>= 1u) {
            if (lid < s) {
                m_s[lid] = max(m_s[lid], m_s[lid + s]);
            }
            workgroupBarrier();
        }
        let m_new = max(m, m_s[0]);
        p_s[lid] = select(0.0, exp(score - m_new), j < b);
        workgroupBarrier();
        let rescale = exp(m - m_new);
        var sum = 0.0;
        for (var i = 0u; i < MAX_DIMS; i++) {
            acc[i] *= rescale;
        }
        let keys = min(KEYS, b - c0);
        let v0 = (kv_row0 + c0) * sh.kv_dim + kvh * hd;
        for (var i = 0u; i < MAX_DIMS; i++) {
            let d = lid + i * KEYS;
            if (d < hd) {
                // Four keys' values loaded before they are added, in order.
                var a = acc[i];
                var jj = 0u;
                for (; jj + 4u <= keys; jj += 4u) {
                    let v = v0 + jj * sh.kv_dim + d;
                    let vs = vec4<f32>(
                        value(v), value(v + sh.kv_dim), value(v + 2u * sh.kv_dim),
                        value(v + 3u * sh.kv_dim)
                    );
                    a += p_s[jj] * vs.x;
                    a += p_s[jj + 1u] * vs.y;
                    a += p_s[jj + 2u] * vs.z;
                    a += p_s[jj + 3u] * vs.w;
                }
                for (; jj < keys; jj++) {
                    a += p_s[jj] * value(v0 + jj * sh.kv_dim + d);
                }
                acc[i] = a;
            }
        }
        for (var jj = 0u; jj < keys; jj++) {
            sum += p_s[jj];
        }
        l = l * rescale + sum;
        m = m_new;
        workgroupBarrier();
    }

    if (batch.splits == 1u) {
        let inv = select(0.0, 1.0 / l, l > 0.0);
        for (var i = 0u; i < MAX_DIMS; i++) {
            let d = lid + i * KEYS;
            if (d < hd) {
                att[t * sh.q_dim + h * hd + d] = acc[i] * inv;
            }
        }
    } else {
        let base = (h * batch.splits + split) * (hd + 2u);
        for (var i = 0u; i < MAX_DIMS; i++) {
            let d = lid + i * KEYS;
            if (d < hd) {
                partial[base + d] = acc[i];
            }
        }
        if (lid == 0u) {
            partial[base + hd] = m;
            partial[base + hd + 1u] = l;
        }
    }
}

// Combines the splits of one decoded token's heads: one workgroup per head.
@compute @workgroup_size(KEYS)
fn attention_reduce(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
    let hd = sh.head_dim;
    var m = NEG;
    for (var s = 0u; s < batch.splits; s++) {
        m = max(m, partial[(h * batch.splits + s) * (hd + 2u) + hd]);
    }
    var l = 0.0;
    for (var s = 0u; s < batch.splits; s++) {
        let base = (h * batch.splits + s) * (hd + 2u);
        l += exp(partial[base + hd] - m) * partial[base + hd + 1u];
    }
    let inv = select(0.0, 1.0 / l, l > 0.0);
    for (var d = lid; d < hd; d += KEYS) {
        var v = 0.0;
        for (var s = 0u; s < batch.splits; s++) {
            let base = (h * batch.splits + s) * (hd + 2u);
            v += exp(partial[base + hd] - m) * partial[base + d];
        }
        att[h * hd + d] = v * inv;
    }
}

//#kv_float
// Attention's reads of an f32 or f16 cache: element i as it is.
fn key(i: u32) -> f32 {
    return f32(k_read[i]);
}

// Elements i .. i + 3.
fn key4(i: u32) -> vec4<f32> {
    return vec4<f32>(vec4<Kv>(k_read[i], k_read[i + 1u], k_read[i + 2u], k_read[i + 3u]));
}

fn value(i: u32) -> f32 {
    return f32(v_read[i]);
}

//#kv_q8_0
// Attention's reads of a Q8_0 cache: element i is quant i % 32 of block i / 32 times its scale.
// (Sign-extending bit fields, not `unpack4xI8`: WGSL has that only with `dot4I8Packed`.)
fn quant8(word: u32, k: u32) -> f32 {
    return f32(extractBits(bitcast<i32>(word), 8u * k, 8u));
}

fn key(i: u32) -> f32 {
    let o = i / 32u * Q8_WORDS;
    let d = unpack2x16float(k_read[o + 8u]).x;
    return quant8(k_read[o + i % 32u / 4u], i % 4u) * d;
}

// Elements i .. i + 3 (i a multiple of 4: one word of quants).
fn key4(i: u32) -> vec4<f32> {
    let o = i / 32u * Q8_WORDS;
    let d = unpack2x16float(k_read[o + 8u]).x;
    let w = k_read[o + i % 32u / 4u];
    return vec4<f32>(quant8(w, 0u), quant8(w, 1u), quant8(w, 2u), quant8(w, 3u)) * d;
}

fn value(i: u32) -> f32 {
    let o = i / 32u * Q8_WORDS;
    let d = unpack2x16float(v_read[o + 8u]).x;
    return quant8(v_read[o + i % 32u / 4u], i % 4u) * d;
}

//#kv_store
// A Q8_0 cache's new rows: the batch rows' K and V that Q|K|V's epilogue staged in f32 (a row
// each), quantized as ggml's `quantize_row_q8_0_ref` does (so the CPU's cache holds the same
// quants), into their places. One thread per block of 32 values.
@group(0) @binding(2) var<storage, read> k_new: array<f32>;
@group(0) @binding(3) var<storage, read> v_new: array<f32>;
@group(0) @binding(4) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<u32>;
@group(0) @binding(7) var<storage, read> places: array<Place>;

fn staged(is_v: bool, i: u32) -> f32 {
    if (is_v) {
        return v_new[i];
    }
    return k_new[i];
}

fn store_word(is_v: bool, i: u32, word: u32) {
    if (is_v) {
        v_cache[i] = word;
    } else {
        k_cache[i] = word;
    }
}

// C's `roundf`: halves away from zero (WGSL's `round` takes them to even).
fn round_away(x: f32) -> f32 {
    let t = trunc(x);
    return t + select(0.0, sign(x), abs(x - t) >= 0.5);
}

@compute @workgroup_size(64)
fn kv_store(@builtin(global_invocation_id) gid: vec3<u32>) {
    let blocks = sh.kv_dim / 32u;
    let t = gid.y;
    if (gid.x >= 2u * blocks || t >= batch.count) {
        return;
    }
    let is_v = gid.x >= blocks;
    let b = gid.x % blocks;
    let src = t * sh.kv_dim + b * 32u;
    var amax = 0.0;
    for (var i = 0u; i < 32u; i++) {
        amax = max(amax, abs(staged(is_v, src + i)));
    }
    let d = amax / 127.0;
    let id = select(0.0, 1.0 / d, d != 0.0);
    let o = ((places[t].kv_row0 + places[t].pos) * blocks + b) * Q8_WORDS;
    for (var w = 0u; w < 8u; w++) {
        var word = 0u;
        for (var k = 0u; k < 4u; k++) {
            let q = clamp(round_away(staged(is_v, src + 4u * w + k) * id), -127.0, 127.0);
            word |= (bitcast<u32>(i32(q)) & 0xffu) << (8u * k);
        }
        store_word(is_v, o + w, word);
    }
    store_word(is_v, o + 8u, pack2x16float(vec2<f32>(d, 0.0)));
}

//#rms_norm
// The final RMSNorm: one workgroup per token.
@group(0) @binding(2) var<storage, read> x_in: array<f32>;
@group(0) @binding(3) var<storage, read> gain: array<f32>;
@group(0) @binding(4) var<storage, read_write> x_out: array<f32>;

var<workgroup> ss_s: array<f32, 64>;

@compute @workgroup_size(64)
fn rms_norm(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = wid.x;
    let base = t * sh.hidden;
    var ss = 0.0;
    for (var c = lid; c < sh.hidden; c += 64u) {
        let v = x_in[base + c];
        ss += v * v;
    }
    ss_s[lid] = ss;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s) {
            ss_s[lid] += ss_s[lid + s];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(ss_s[0] / f32(sh.hidden) + sh.eps);
    for (var c = lid; c < sh.hidden; c += 64u) {
        x_out[base + c] = x_in[base + c] * inv * gain[c];
    }
}

//#argmax
// Greedy argmax of the first row of logits: the first index of the largest value.
@group(0) @binding(2) var<storage, read> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> best: array<u32>;

var<workgroup> bv: array<f32, 256>;
var<workgroup> bi: array<u32, 256>;

@compute @workgroup_size(256)
fn argmax(@builtin(local_invocation_index) lid: u32) {
    var v = NEG;
    var idx = 0xffffffffu;
    for (var i = lid; i < sh.vocab; i += 256u) {
        let l = logits[i];
        if (idx == 0xffffffffu || l > v) {
            v = l;
            idx = i;
        }
    }
    bv[lid] = v;
    bi[lid] = idx;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let ov = bv[lid + s];
            let oi = bi[lid + s];
            if (oi != 0xffffffffu && (bi[lid] == 0xffffffffu || ov > bv[lid] || (ov == bv[lid] && oi < bi[lid]))) {
                bv[lid] = ov;
                bi[lid] = oi;
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        best[0] = select(bi[0], 0u, bi[0] == 0xffffffffu);
    }
}
