// Per weight format (Q4_0 and Q4_1 with `nibbles`), `deq`: values 4j .. 4j+3 of block `b` (32
// values) of row `row` of the part, scaled; and for the integer formats, `qword`: their quants as
// four i8 in a word, and `qdot`: a block's dot product with Q16 activations (scale `xd`, sum
// `xs`) from the quants' integer dot product `dot`. Layouts (written by gpu/weights.rs): quants
// first, row-major by block; then, at word `d_off`, one f32 scale per block (and at `m_off` one
// f32 minimum for Q4_1).

//#Q8_0
fn deq(row: u32, b: u32, j: u32) -> vec4<f32> {
    let blk = row * p.nb + b;
    let q = w[blk * 8u + j];
    let d = bitcast<f32>(w[p.d_off + blk]);
    let v = vec4<i32>(i32(q << 24u), i32(q << 16u), i32(q << 8u), i32(q)) >> vec4<u32>(24u);
    return vec4<f32>(v) * d;
}

fn qword(row: u32, b: u32, j: u32) -> u32 {
    return w[(row * p.nb + b) * 8u + j];
}

fn qdot(row: u32, b: u32, dot: i32, xd: f32, xs: f32) -> f32 {
    return bitcast<f32>(w[p.d_off + row * p.nb + b]) * xd * f32(dot);
}

//#Q4_0
fn deq(row: u32, b: u32, j: u32) -> vec4<f32> {
    let blk = row * p.nb + b;
    let q = qword(row, b, j);
    let d = bitcast<f32>(w[p.d_off + blk]);
    let n = vec4<u32>(q & 0xffu, (q >> 8u) & 0xffu, (q >> 16u) & 0xffu, q >> 24u);
    return (vec4<f32>(n) - 8.0) * d;
}

// Σ d(n - 8)·xd·q = d·(xd·Σnq - 8·xs).
fn qdot(row: u32, b: u32, dot: i32, xd: f32, xs: f32) -> f32 {
    return bitcast<f32>(w[p.d_off + row * p.nb + b]) * (xd * f32(dot) - 8.0 * xs);
}

//#Q4_1
fn deq(row: u32, b: u32, j: u32) -> vec4<f32> {
    let blk = row * p.nb + b;
    let q = qword(row, b, j);
    let d = bitcast<f32>(w[p.d_off + blk]);
    let m = bitcast<f32>(w[p.m_off + blk]);
    let n = vec4<u32>(q & 0xffu, (q >> 8u) & 0xffu, (q >> 16u) & 0xffu, q >> 24u);
    return vec4<f32>(n) * d + m;
}

// Σ (d·n + m)·xd·q = d·xd·Σnq + m·xs.
fn qdot(row: u32, b: u32, dot: i32, xd: f32, xs: f32) -> f32 {
    let blk = row * p.nb + b;
    return bitcast<f32>(w[p.d_off + blk]) * xd * f32(dot) + bitcast<f32>(w[p.m_off + blk]) * xs;
}

//#nibbles
// Q4_0's and Q4_1's quants, 0..15: word j < 4 of a block holds values 4j .. 4j+3 in its low
// nibbles, word j - 4 values 4j .. 4j+3 in its high ones.
fn qword(row: u32, b: u32, j: u32) -> u32 {
    return (w[(row * p.nb + b) * 4u + (j & 3u)] >> select(0u, 4u, j >= 4u)) & 0x0f0f0f0fu;
}

//#F16
fn deq(row: u32, b: u32, j: u32) -> vec4<f32> {
    let i = (row * p.nb * 32u + b * 32u + j * 4u) / 2u;
    return vec4<f32>(unpack2x16float(w[i]), unpack2x16float(w[i + 1u]));
}

//#F32
fn deq(row: u32, b: u32, j: u32) -> vec4<f32> {
    let i = row * p.nb * 32u + b * 32u + j * 4u;
    return bitcast<vec4<f32>>(vec4<u32>(w[i], w[i + 1u], w[i + 2u], w[i + 3u]));
}
