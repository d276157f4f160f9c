//! Just enough protobuf to read SentencePiece's `tokenizer.model` (a `ModelProto`): its
//! `pieces` (field 1), each a `SentencePiece { piece = 1, score = 2, type = 3 }`. Every other
//! field is skipped; every length is checked against the bytes that remain.
use anyhow::{bail, Result};

/// One piece of the vocabulary.
pub struct Piece {
    pub piece: String,
    pub score: f32,
    /// SentencePiece's type: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    pub kind: i32,
}

/// The pieces of a `ModelProto`, in id order.
pub fn sentencepieces(bytes: &[u8]) -> Result<Vec<Piece>> {
    let mut pieces = Vec::new();
    let mut r = Reader { bytes, pos: 0 };
    while let Some((field, value)) = r.field()? {
        if let (1, Field::Bytes(message)) = (field, value) {
            pieces.push(piece(message)?);
        }
    }
    if pieces.is_empty() {
        bail!("no vocabulary pieces: not a SentencePiece model");
    }
    Ok(pieces)
}

fn piece(message: &[u8]) -> Result<Piece> {
    let mut p = Piece {
        piece: String::new(),
        score: 0.0,
        kind: 1,
    };
    let mut r = Reader {
        bytes: message,
        pos: 0,
    };
    while let Some((field, value)) = r.field()? {
        match (field, value) {
            (1, Field::Bytes(b)) => p.piece = String::from_utf8_lossy(b).into_owned(),
            (2, Field::Fixed32(bits)) => p.score = f32::from_bits(bits),
            (3, Field::Varint(v)) => p.kind = v as i32,
            _ => {}
        }
    }
    Ok(p)
}

enum Field<'a> {
    Varint(u64),
    Fixed64,
    Bytes(&'a [u8]),
    Fixed32(u32),
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&b) = self.bytes.get(self.pos) else {
                bail!("truncated varint at byte {}", self.pos);
            };
            self.pos += 1;
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        bail!("varint longer than 10 bytes at byte {}", self.pos)
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8]> {
        let rest = self.bytes.len() - self.pos;
        if n > rest as u64 {
            bail!(
                "a field of {n} bytes at byte {} runs past the end ({rest} left)",
                self.pos
            );
        }
        let out = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(out)
    }

    /// The next field number and value, or `None` at the end.
    fn field(&mut self) -> Result<Option<(u64, Field<'a>)>> {
        if self.pos == self.bytes.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let value = match key & 7 {
            0 => Field::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Field::Fixed64
            }
            2 => {
                let n = self.varint()?;
                Field::Bytes(self.take(n)?)
            }
            5 => Field::Fixed32(u32::from_le_bytes(self.take(4)?.try_into()?)),
            wire => bail!(
                "protobuf wire type {wire} at byte {} is not supported",
                self.pos
            ),
        };
        Ok(Some((key >> 3, value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_pieces_and_refuses_truncation() {
        // ModelProto { pieces: [{ piece: "▁a", score: -1.5, type: 6 }], trainer_spec: {} }
        let mut piece = vec![0x0a, 4];
        piece.extend_from_slice("▁a".as_bytes());
        piece.push(0x15);
        piece.extend_from_slice(&(-1.5f32).to_le_bytes());
        piece.extend_from_slice(&[0x18, 6]);
        let mut model = vec![0x0a, piece.len() as u8];
        model.extend_from_slice(&piece);
        model.extend_from_slice(&[0x12, 0]);
        let pieces = sentencepieces(&model).unwrap();
        assert_eq!(pieces.len(), 1);
        assert_eq!(
            (pieces[0].piece.as_str(), pieces[0].score, pieces[0].kind),
            ("▁a", -1.5, 6)
        );
        for n in 1..model.len() - 2 {
            assert!(sentencepieces(&model[..n]).is_err(), "{n} bytes");
        }
        assert!(sentencepieces(&[]).is_err());
        assert!(sentencepieces(&[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]).is_err());
    }
}
