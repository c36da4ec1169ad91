//! sha256 digests: parsing `sha256:<hex>`, hashing while reading or writing.

use std::fmt;
use std::io::{self, Read, Write};

use sha2::{Digest as _, Sha256};

#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest {
    hex: String,
}

impl Digest {
    pub fn parse(s: &str) -> Result<Digest, String> {
        let hex = s
            .strip_prefix("sha256:")
            .ok_or_else(|| format!("digest {s:?} is not sha256:<hex>"))?;
        Digest::from_hex(hex).map_err(|e| format!("digest {s:?}: {e}"))
    }

    pub(crate) fn from_hex(hex: &str) -> Result<Digest, String> {
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err("expected 64 hex characters".to_string());
        }
        Ok(Digest {
            hex: hex.to_ascii_lowercase(),
        })
    }

    pub fn of(data: &[u8]) -> Digest {
        Digest {
            hex: hex::encode(Sha256::digest(data)),
        }
    }

    pub fn hex(&self) -> &str {
        &self.hex
    }

    /// The first 12 hex characters, as `docker images` shows ids.
    pub fn short(&self) -> &str {
        &self.hex[..12]
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

impl TryFrom<String> for Digest {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        Digest::parse(&s)
    }
}

impl From<Digest> for String {
    fn from(d: Digest) -> String {
        d.to_string()
    }
}

/// Hashes everything read through it.
pub(crate) struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> HashingReader<R> {
    pub(crate) fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    /// Read the rest of the stream (so the digest covers all of it) and return digest and size.
    pub(crate) fn finish(mut self) -> io::Result<(Digest, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((
            Digest {
                hex: hex::encode(self.hasher.finalize()),
            },
            self.count,
        ))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

/// Hashes everything written through it.
pub(crate) struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    count: u64,
}

impl<W: Write> HashingWriter<W> {
    pub(crate) fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    pub(crate) fn finish(self) -> (W, Digest, u64) {
        (
            self.inner,
            Digest {
                hex: hex::encode(self.hasher.finalize()),
            },
            self.count,
        )
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display_round_trip() {
        let d = Digest::of(b"hello");
        assert_eq!(
            d.to_string(),
            "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert_eq!(Digest::parse(&d.to_string()).unwrap(), d);
        assert!(Digest::parse("md5:abc").is_err());
        assert!(Digest::parse("sha256:xyz").is_err());
    }

    #[test]
    fn hashing_reader_matches_of() {
        let data = vec![7u8; 100_000];
        let r = HashingReader::new(&data[..]);
        let (d, n) = r.finish().unwrap();
        assert_eq!(d, Digest::of(&data));
        assert_eq!(n, 100_000);
    }
}
