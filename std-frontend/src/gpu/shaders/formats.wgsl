// Per weight layout's scales (with the section its quants need: `bytes`, `nibbles`,
// `nibbles_bit` or `nibbles_2bits`), `deq`: values 4j .. 4j+3 of block `b` (32 values) of row
// `row` of the part, scaled; and for the integer layouts, `qword`: their quants as four i8 in a
// word, and `qdot`: a block's dot product with Q16 activations (scale `xd`, sums of the quants of
// each 16-value half `xsum`) from the quants' integer dot products over each half, `dot`. Layouts
// (written by gpu/weights.rs): quants first, row-major by block; then, at word `d_off`, the f32
// scales (one per block, two for Q8_HALVES and Q6_HALVES) and at `m_off` as many f32 minimums
// (Q4_1 and Q5, whose quants are 5-bit and which takes Q4_1's section; Q8_HALVES); the k-quants'
// layouts (Q4_K, Q5_K with Q4_K's section, Q6_K) keep their super-blocks' f32 scales at `d_off`
// and each block's 8-bit multipliers at `m_off`, two blocks to a word. A row holds whole
// super-blocks of 8 blocks, so block `blk` of the part is in super-block `blk / 8`.

//#Q8_0
fn deq(row: u32, b: u32, j: u32) -> vec4<f32> {
    let d = bitcast<f32>(w[p.d_off + row * p.nb + b]);
    return vec4<f32>(bytes4(qword(row, b, j))) * d;
}

fn qdot(row: u32, b: u32, dot: vec2<i32>, xd: f32, xsum: vec2<i32>) -> f32 {
    return bitcast<f32>(w[p.d_off + row * p.nb + b]) * xd * f32(dot.x + dot.y);
}

//#Q4_0
fn deq(row: u32, b: u32, j: u32) -> vec4<f32> {
    let blk = row * p.nb + b;
    let q = qword(row, b, j);
    let d = bitcast<f32>(w[p.d_off + blk]);
    let n = vec4<u32>(q & 0xffu, (q >> 8u) & 0xffu, (q >> 16u) & 0xffu, q >> 24u);
    return (vec4<f32>(n) - 8.0) * d;
}

// Σ d(n - 8)·xd·q = d·(xd·Σnq - 8·xd·Σq).
fn qdot(row: u32, b: u32, dot: vec2<i32>, xd: f32, xsum: vec2<i32>) -> f32 {
    let xs = xd * f32(xsum.x + xsum.y);
    return bitcast<f32>(w[p.d_off + row * p.nb + b]) * (xd * f32(dot.x + dot.y) - 8.0 * xs);
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

// Σ (d·n + m)·xd·q = d·xd·Σnq + m·xd·Σq.
fn qdot(row: u32, b: u32, dot: vec2<i32>, xd: f32, xsum: vec2<i32>) -> f32 {
    let blk = row * p.nb + b;
    let xs = xd * f32(xsum.x + xsum.y);
    return bitcast<f32>(w[p.d_off + blk]) * xd * f32(dot.x + dot.y)
        + bitcast<f32>(w[p.m_off + blk]) * xs;
}

//#Q8_HALVES
// Any integer format's blocks (Q5_1 and the k-quants): per 16-value half h of block `blk`, the
// scale at word `d_off + 2·blk + h` and the minimum at `m_off + 2·blk + h`.
fn deq(row: u32, b: u32, j: u32) -> vec4<f32> {
    let h = (row * p.nb + b) * 2u + j / 4u;
    let s = bitcast<f32>(w[p.d_off + h]);
    return vec4<f32>(bytes4(qword(row, b, j))) * s + bitcast<f32>(w[p.m_off + h]);
}

// Σ_h Σ (s_h·n + m_h)·xd·q = xd·Σ_h (s_h·Σnq + m_h·Σq).
fn qdot(row: u32, b: u32, dot: vec2<i32>, xd: f32, xsum: vec2<i32>) -> f32 {
    let h = (row * p.nb + b) * 2u;
    let s = vec2<f32>(bitcast<f32>(w[p.d_off + h]), bitcast<f32>(w[p.d_off + h + 1u]));
    let m = vec2<f32>(bitcast<f32>(w[p.m_off + h]), bitcast<f32>(w[p.m_off + h + 1u]));
    let halves = s * vec2<f32>(dot) + m * vec2<f32>(xsum);
    return xd * (halves.x + halves.y);
}

//#Q6_HALVES
// 6-bit quants u = q + 32 with an f32 scale per 16-value half h of block `blk` at word
// `d_off + 2·blk + h`: values s_h·(u − 32).
fn deq(row: u32, b: u32, j: u32) -> vec4<f32> {
    let s = bitcast<f32>(w[p.d_off + (row * p.nb + b) * 2u + j / 4u]);
    let q = qword(row, b, j);
    let u = vec4<u32>(q & 0xffu, (q >> 8u) & 0xffu, (q >> 16u) & 0xffu, q >> 24u);
    return (vec4<f32>(u) - 32.0) * s;
}

// Σ_h Σ s_h·(u − 32)·xd·q = xd·Σ_h s_h·(Σuq − 32·Σq).
fn qdot(row: u32, b: u32, dot: vec2<i32>, xd: f32, xsum: vec2<i32>) -> f32 {
    let h = (row * p.nb + b) * 2u;
    let s = vec2<f32>(bitcast<f32>(w[p.d_off + h]), bitcast<f32>(w[p.d_off + h + 1u]));
    let halves = s * vec2<f32>(dot - 32i * xsum);
    return xd * (halves.x + halves.y);
}

//#Q4_K
// Per super-block s, `d` and `-dmin` at words d_off + 2s, 2s + 1; per block its scale and minimum
// multipliers (0..63), bits 0-7 and 8-15 of its half of word m_off + blk / 2: values
// d·scale·n − dmin·min (each product exact in f32, as the core's).
fn scale_min(row: u32, b: u32) -> vec2<f32> {
    let blk = row * p.nb + b;
    let s = p.d_off + blk / 8u * 2u;
    let ints = w[p.m_off + blk / 2u] >> (16u * (blk % 2u));
    let dm = vec2<f32>(bitcast<f32>(w[s]), bitcast<f32>(w[s + 1u]));
    return dm * vec2<f32>(f32(ints & 0xffu), f32((ints >> 8u) & 0xffu));
}

fn deq(row: u32, b: u32, j: u32) -> vec4<f32> {
    let sm = scale_min(row, b);
    let q = qword(row, b, j);
    let n = vec4<u32>(q & 0xffu, (q >> 8u) & 0xffu, (q >> 16u) & 0xffu, q >> 24u);
    return vec4<f32>(n) * sm.x + sm.y;
}

// Σ (s·n + m)·xd·q = s·xd·Σnq + m·xd·Σq, as Q4_1's.
fn qdot(row: u32, b: u32, dot: vec2<i32>, xd: f32, xsum: vec2<i32>) -> f32 {
    let sm = scale_min(row, b);
    let xs = xd * f32(xsum.x + xsum.y);
    return sm.x * xd * f32(dot.x + dot.y) + sm.y * xs;
}

//#Q6_K
// Per super-block s, `d` at word d_off + s; per block its halves' signed scale multipliers, bits
// 0-7 and 8-15 of its half of word m_off + blk / 2: values d·scale_h·(u − 32), as Q6_HALVES'.
fn half_scales(row: u32, b: u32) -> vec2<f32> {
    let blk = row * p.nb + b;
    let d = bitcast<f32>(w[p.d_off + blk / 8u]);
    let ints = bitcast<i32>(w[p.m_off + blk / 2u] >> (16u * (blk % 2u)));
    return d * vec2<f32>(f32(extractBits(ints, 0u, 8u)), f32(extractBits(ints, 8u, 8u)));
}

fn deq(row: u32, b: u32, j: u32) -> vec4<f32> {
    let s = half_scales(row, b);
    let q = qword(row, b, j);
    let u = vec4<u32>(q & 0xffu, (q >> 8u) & 0xffu, (q >> 16u) & 0xffu, q >> 24u);
    return (vec4<f32>(u) - 32.0) * select(s.x, s.y, j >= 4u);
}

fn qdot(row: u32, b: u32, dot: vec2<i32>, xd: f32, xsum: vec2<i32>) -> f32 {
    let halves = half_scales(row, b) * vec2<f32>(dot - 32i * xsum);
    return xd * (halves.x + halves.y);
}

//#bytes
// Q8_0's and Q8_HALVES' quants: word j of a block holds values 4j .. 4j+3, one signed byte each.
fn qword(row: u32, b: u32, j: u32) -> u32 {
    return w[(row * p.nb + b) * 8u + j];
}

fn bytes4(q: u32) -> vec4<i32> {
    return vec4<i32>(i32(q << 24u), i32(q << 16u), i32(q << 8u), i32(q)) >> vec4<u32>(24u);
}

//#nibbles
// Q4_0's, Q4_1's and Q4_K's quants, 0..15: word j < 4 of a block holds values 4j .. 4j+3 in its low
// nibbles, word j - 4 values 4j .. 4j+3 in its high ones.
fn qword(row: u32, b: u32, j: u32) -> u32 {
    return (w[(row * p.nb + b) * 4u + (j & 3u)] >> select(0u, 4u, j >= 4u)) & 0x0f0f0f0fu;
}

//#nibbles_bit
// Q5's and Q5_K's quants, 0..31: five words a block, the first four its low nibbles as Q4_1's, the fifth
// the high bits (value k's in bit k).
fn qword(row: u32, b: u32, j: u32) -> u32 {
    let base = (row * p.nb + b) * 5u;
    let lo = (w[base + (j & 3u)] >> select(0u, 4u, j >= 4u)) & 0x0f0f0f0fu;
    let bits = (w[base + 4u] >> (4u * j)) & 0xfu;
    let hi = (bits & 1u) | ((bits & 2u) << 7u) | ((bits & 4u) << 14u) | ((bits & 8u) << 21u);
    return lo | (hi << 4u);
}

//#nibbles_2bits
// Q6_HALVES' and Q6_K's quants, 0..63: six words a block, the first four its low nibbles as Q4_1's, the last
// two the high bits (value k's two in bits 2k, 2k + 1 of the 64).
fn qword(row: u32, b: u32, j: u32) -> u32 {
    let base = (row * p.nb + b) * 6u;
    let lo = (w[base + (j & 3u)] >> select(0u, 4u, j >= 4u)) & 0x0f0f0f0fu;
    let bits = (w[base + 4u + j / 4u] >> (8u * (j % 4u))) & 0xffu;
    let hi = (bits & 3u) | ((bits & 0xcu) << 6u) | ((bits & 0x30u) << 12u)
        | ((bits & 0xc0u) << 18u);
    return lo | (hi << 4u);
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
