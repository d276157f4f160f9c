// The layer loop's steps that are not mat-muls (RoPE and the KV store are Q|K|V's epilogue, in
// matmul.wgsl): attention (one query head of one token per workgroup, an online softmax over the
// cached keys, optionally split over the context and combined by `attention_reduce`), the final
// RMSNorm, and greedy argmax. Each `//#name` section is compiled with the lines above the first
// section, as its own module; those that touch the KV cache get the type of its values, `Kv`
// (f32 or f16), first.

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
                let kd = vec4<f32>(vec4<Kv>(
                    k_read[k + d], k_read[k + d + 1u], k_read[k + d + 2u], k_read[k + d + 3u]
                ));
                s += q_s[d] * kd.x;
                s += q_s[d + 1u] * kd.y;
                s += q_s[d + 2u] * kd.z;
                s += q_s[d + 3u] * kd.w;
            }
            for (; d < hd; d++) {
                s += q_s[d] * f32(k_read[k + d]);
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
                    let vs = vec4<f32>(vec4<Kv>(
                        v_read[v], v_read[v + sh.kv_dim], v_read[v + 2u * sh.kv_dim],
                        v_read[v + 3u * sh.kv_dim]
                    ));
                    a += p_s[jj] * vs.x;
                    a += p_s[jj + 1u] * vs.y;
                    a += p_s[jj + 2u] * vs.z;
                    a += p_s[jj + 3u] * vs.w;
                }
                for (; jj < keys; jj++) {
                    a += p_s[jj] * f32(v_read[v0 + jj * sh.kv_dim + d]);
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
