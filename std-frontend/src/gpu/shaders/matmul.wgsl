// Mat-vec and tiled mat-mat over one part of a weight matrix, with the layer loop's fusions:
// an RMSNorm prologue (NORM), and an epilogue that stores (plus a bias), adds into the residual
// stream, or multiplies SiLU(gate) by up for interleaved gate/up rows (EPI). The Rust side
// prepends the constants ROWS, LANES, TOK, NORM, BIAS, EPI and the format's `deq`.
//
// A workgroup computes ROWS rows for TOK tokens; LANES threads share a row, each striding over
// its 32-value blocks, then the lanes' sums are added in a tree.

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

const WG: u32 = ROWS * LANES;
const EPI_STORE: u32 = 0u;
const EPI_ADD: u32 = 1u;
const EPI_SWIGLU: u32 = 2u;

var<workgroup> red: array<f32, WG * TOK>;
var<workgroup> inv_rms: array<f32, TOK>;

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

fn silu(v: f32) -> f32 {
    return v / (1.0 + exp(-v));
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

    let r = lid / LANES;
    let lane = lid % LANES;
    let row = row_base + r;
    var acc: array<f32, TOK>;
    if (row < p.rows) {
        for (var b = lane; b < p.nb; b += LANES) {
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
    for (var t = 0u; t < TOK; t++) {
        red[lid * TOK + t] = acc[t];
    }
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            for (var t = 0u; t < TOK; t++) {
                red[lid * TOK + t] += red[(lid + s) * TOK + t];
            }
        }
        workgroupBarrier();
    }

    if (lid < ROWS * TOK) {
        let rr = lid / TOK;
        let t = lid % TOK;
        let out_row = row_base + rr;
        let tok = tok_base + t;
        if (out_row < p.rows && tok < tok_end) {
            var v = red[rr * LANES * TOK + t];
            if (NORM) {
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
                var u = red[(rr + 1u) * LANES * TOK + t];
                if (NORM) {
                    u *= inv_rms[t];
                }
                y[o + (p.out_row0 + out_row) / 2u] = silu(v) * u;
            }
        }
    }
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
