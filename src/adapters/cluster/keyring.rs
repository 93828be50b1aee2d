//! The gossip keyring: the symmetric keys every gossip datagram is sealed
//! with, as memberlist and Serf do it (`encrypt` keyring: install, use,
//! remove).
//!
//! # File
//!
//! A text file (`peerlb certs` writes `gossip.keys`, mode 0600, next to the
//! CA) with one key a line: 32 random bytes in standard base64 (44
//! characters with padding). Blank lines and lines starting with `#` are
//! ignored. The first key is the *sending* key; every key of the ring opens
//! received datagrams. At most [`MAX_KEYS`] keys.
//!
//! # Sealed datagram
//!
//! `[1 byte format = 1][12 bytes nonce][chitchat bytes sealed with
//! ChaCha20-Poly1305 (RFC 8439), 16-byte tag appended]`; the format byte is
//! the additional authenticated data. A receiver tries each key of its ring
//! in order (trial decryption, as memberlist does): at most [`MAX_KEYS`]
//! ChaCha20-Poly1305 openings per datagram. Nonces are random, 96 bits (the
//! OS generator in production, a seeded generator in the simulation), so
//! the nonce-reuse bound of RFC 8439 §4 (random nonces: keep a key under
//! about 2^32 datagrams) holds for years of gossip at one datagram per
//! second per node pair.

use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::SecureRandom as _;

/// The keyring's file name in the certificate directory (`peerlb certs`
/// creates it; `tls.gossip_keyring` defaults to it).
pub const FILE_NAME: &str = "gossip.keys";

/// Length of a gossip key in bytes (ChaCha20-Poly1305).
pub const KEY_LEN: usize = 32;

/// Most keys a ring holds (each is one trial decryption per datagram).
pub const MAX_KEYS: usize = 8;

/// The format byte a sealed datagram starts with.
const FORMAT: u8 = 1;

/// Bytes sealing adds to a datagram: format byte, nonce and tag.
pub const SEAL_OVERHEAD: usize = 1 + NONCE_LEN + 16;

// The gossip budget (`engine::gossip_budget`) counts on this seal size.
const _: () = assert!(SEAL_OVERHEAD == crate::engine::gossip_budget::SEAL_OVERHEAD);

/// One gossip key: 32 secret bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct GossipKey([u8; KEY_LEN]);

impl fmt::Debug for GossipKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GossipKey({})", self.fingerprint())
    }
}

impl GossipKey {
    /// A key from its 32 bytes.
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> GossipKey {
        GossipKey(bytes)
    }

    /// A fresh key from the operating system's generator.
    ///
    /// # Errors
    /// [`KeyringError::Random`] when the OS generator fails.
    pub fn generate() -> Result<GossipKey, KeyringError> {
        let mut k = [0u8; KEY_LEN];
        ring::rand::SystemRandom::new()
            .fill(&mut k)
            .map_err(|_| KeyringError::Random)?;
        Ok(GossipKey(k))
    }

    /// Parses one key: standard base64 of exactly [`KEY_LEN`] bytes
    /// (surrounding whitespace ignored).
    ///
    /// # Errors
    /// [`KeyringError::BadKey`] when the text is not base64 of 32 bytes.
    pub fn parse(text: &str) -> Result<GossipKey, KeyringError> {
        let bad = |reason: &str| KeyringError::BadKey {
            line: 0,
            reason: reason.to_owned(),
        };
        let bytes = STANDARD
            .decode(text.trim())
            .map_err(|e| bad(&format!("not base64: {e}")))?;
        let bytes: [u8; KEY_LEN] = bytes
            .try_into()
            .map_err(|b: Vec<u8>| bad(&format!("{} bytes, a key is {KEY_LEN}", b.len())))?;
        Ok(GossipKey(bytes))
    }

    /// The key as standard base64 (the file form).
    pub fn to_base64(&self) -> String {
        STANDARD.encode(self.0)
    }

    /// A public name for the key: the first 8 hex digits of its SHA-256,
    /// safe to log and to pass to the admin API (reveals nothing usable).
    pub fn fingerprint(&self) -> String {
        let d = ring::digest::digest(&ring::digest::SHA256, &self.0);
        d.as_ref()[..4].iter().map(|b| format!("{b:02x}")).collect()
    }

    fn aead(&self) -> LessSafeKey {
        // A 32-byte key is always accepted by ChaCha20-Poly1305.
        LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &self.0).expect("32-byte key"))
    }
}

/// A keyring could not be read, parsed or changed.
#[derive(Debug, thiserror::Error)]
pub enum KeyringError {
    /// The keyring file cannot be read: create it with `peerlb certs`.
    #[error("cannot read {path}: {error} (create it with `peerlb certs`)")]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// The OS error.
        error: std::io::Error,
    },
    /// A line is not a key (line 0: a key given alone, e.g. to the admin API).
    #[error("line {line}: {reason}")]
    BadKey {
        /// 1-based line number in the file (0 when not from a file).
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The file holds no key.
    #[error("no key (one base64 key of 32 bytes a line, the first is the sending key)")]
    Empty,
    /// More keys than [`MAX_KEYS`].
    #[error("{0} keys, at most {MAX_KEYS}")]
    TooMany(usize),
    /// The OS random generator failed.
    #[error("the operating system's random generator failed")]
    Random,
    /// The key to use or remove is not in the ring.
    #[error("no key {0} in the ring")]
    Unknown(String),
    /// The sending key cannot be removed: switch to another first.
    #[error("key {0} is the sending key: use another key first")]
    RemoveSending(String),
    /// The keyring file cannot be written.
    #[error("cannot write {path}: {error}")]
    Write {
        /// The file.
        path: std::path::PathBuf,
        /// The OS error.
        error: std::io::Error,
    },
}

/// The keys of a ring; the first one seals, all of them open.
///
/// Invariant: 1..=[`MAX_KEYS`] keys, no duplicates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyring {
    keys: Vec<GossipKey>,
}

impl Keyring {
    /// A ring of one key.
    pub fn single(key: GossipKey) -> Keyring {
        Keyring { keys: vec![key] }
    }

    /// Parses the file form (see the module doc); duplicate keys are kept
    /// once.
    ///
    /// # Errors
    /// [`KeyringError::BadKey`] with the line, [`KeyringError::Empty`],
    /// [`KeyringError::TooMany`].
    pub fn parse(text: &str) -> Result<Keyring, KeyringError> {
        let mut keys: Vec<GossipKey> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let key = GossipKey::parse(line).map_err(|e| match e {
                KeyringError::BadKey { reason, .. } => KeyringError::BadKey {
                    line: i + 1,
                    reason,
                },
                other => other,
            })?;
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        if keys.is_empty() {
            return Err(KeyringError::Empty);
        }
        if keys.len() > MAX_KEYS {
            return Err(KeyringError::TooMany(keys.len()));
        }
        Ok(Keyring { keys })
    }

    /// Reads and parses a keyring file.
    ///
    /// # Errors
    /// [`KeyringError::Read`], or as [`Keyring::parse`].
    pub fn load(path: &Path) -> Result<Keyring, KeyringError> {
        let text = std::fs::read_to_string(path).map_err(|error| KeyringError::Read {
            path: path.to_owned(),
            error,
        })?;
        Keyring::parse(&text)
    }

    /// The file form: a comment line, then one base64 key a line, the
    /// sending key first.
    pub fn to_file_text(&self) -> String {
        let mut s = String::from(
            "# peerlb gossip keyring: one base64 key a line, the first seals. Keep it secret.\n",
        );
        for k in &self.keys {
            s.push_str(&k.to_base64());
            s.push('\n');
        }
        s
    }

    /// The keys, sending key first.
    pub fn keys(&self) -> &[GossipKey] {
        &self.keys
    }

    /// The fingerprints of the keys, sending key first.
    pub fn fingerprints(&self) -> Vec<String> {
        self.keys.iter().map(GossipKey::fingerprint).collect()
    }

    /// Adds `key` (opening only) at the end; no change when present.
    ///
    /// # Errors
    /// [`KeyringError::TooMany`] when the ring is full.
    pub fn install(&mut self, key: GossipKey) -> Result<(), KeyringError> {
        if self.keys.contains(&key) {
            return Ok(());
        }
        if self.keys.len() >= MAX_KEYS {
            return Err(KeyringError::TooMany(self.keys.len() + 1));
        }
        self.keys.push(key);
        Ok(())
    }

    /// Makes the key with fingerprint `fp` the sending key.
    ///
    /// # Errors
    /// [`KeyringError::Unknown`] when no key has that fingerprint.
    pub fn use_key(&mut self, fp: &str) -> Result<(), KeyringError> {
        let i = self.position(fp)?;
        let k = self.keys.remove(i);
        self.keys.insert(0, k);
        Ok(())
    }

    /// Removes the key with fingerprint `fp`.
    ///
    /// # Errors
    /// [`KeyringError::Unknown`]; [`KeyringError::RemoveSending`] for the
    /// sending key.
    pub fn remove(&mut self, fp: &str) -> Result<(), KeyringError> {
        let i = self.position(fp)?;
        if i == 0 {
            return Err(KeyringError::RemoveSending(fp.to_owned()));
        }
        self.keys.remove(i);
        Ok(())
    }

    fn position(&self, fp: &str) -> Result<usize, KeyringError> {
        self.keys
            .iter()
            .position(|k| k.fingerprint() == fp)
            .ok_or_else(|| KeyringError::Unknown(fp.to_owned()))
    }

    /// Seals `plain` with the sending key and `nonce`:
    /// `[FORMAT][nonce][ciphertext][tag]`, [`SEAL_OVERHEAD`] bytes longer.
    pub fn seal(&self, plain: &[u8], nonce: [u8; NONCE_LEN]) -> Vec<u8> {
        let mut out = Vec::with_capacity(plain.len() + SEAL_OVERHEAD);
        out.push(FORMAT);
        out.extend_from_slice(&nonce);
        let mut body = plain.to_vec();
        // Sealing fails only past ChaCha20's 256 GiB message limit.
        self.keys[0]
            .aead()
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from([FORMAT]),
                &mut body,
            )
            .expect("a datagram is far below ChaCha20-Poly1305's message limit");
        out.extend_from_slice(&body);
        out
    }

    /// Opens a sealed datagram with the first key of the ring that
    /// authenticates it; `None` when none does (or the datagram is not in
    /// the sealed format).
    pub fn open(&self, sealed: &[u8]) -> Option<Vec<u8>> {
        if sealed.len() < SEAL_OVERHEAD || sealed[0] != FORMAT {
            return None;
        }
        let nonce: [u8; NONCE_LEN] = sealed[1..1 + NONCE_LEN].try_into().ok()?;
        let body = &sealed[1 + NONCE_LEN..];
        self.keys.iter().find_map(|k| {
            let mut buf = body.to_vec();
            let plain = k
                .aead()
                .open_in_place(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::from([FORMAT]),
                    &mut buf,
                )
                .ok()?;
            Some(plain.to_vec())
        })
    }
}

/// Writes a new keyring file with one fresh key (mode 0600) unless `path`
/// exists. Returns whether it was created.
///
/// # Errors
/// [`KeyringError::Random`], [`KeyringError::Write`].
pub fn create_file(path: &Path) -> Result<bool, KeyringError> {
    if path.exists() {
        return Ok(false);
    }
    let ring = Keyring::single(GossipKey::generate()?);
    write_file(path, &ring, true)?;
    Ok(true)
}

/// Writes `ring` to `path` (mode 0600): `new` fails if the file exists,
/// otherwise the file is replaced through a temporary file and a rename.
///
/// # Errors
/// [`KeyringError::Write`].
pub fn write_file(path: &Path, ring: &Keyring, new: bool) -> Result<(), KeyringError> {
    use std::io::Write as _;
    let err = |error| KeyringError::Write {
        path: path.to_owned(),
        error,
    };
    let target = if new {
        path.to_owned()
    } else {
        path.with_extension("keys.tmp")
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true);
    if new {
        options.create_new(true);
    } else {
        options.create(true).truncate(true);
    }
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = options.open(&target).map_err(err)?;
    f.write_all(ring.to_file_text().as_bytes()).map_err(err)?;
    f.sync_all().map_err(err)?;
    if !new {
        std::fs::rename(&target, path).map_err(err)?;
    }
    Ok(())
}

/// Where nonces come from.
enum NonceSource {
    /// The operating system's generator (production).
    System(ring::rand::SystemRandom),
    /// SplitMix64 from a seed (the simulation: same seed, same bytes).
    Seeded(Mutex<u64>),
}

/// What the gossip layer dropped, counted since start.
#[derive(Debug, Default)]
pub struct GossipCounters {
    /// Datagrams no key of the ring opened (forged, another cluster, a
    /// removed key, or not sealed at all).
    pub unauthenticated: AtomicU64,
    /// Sealed datagrams whose content broke a bound (see `bounds`).
    pub out_of_bounds: AtomicU64,
    /// Datagrams not sent because sealing made them larger than a UDP
    /// datagram.
    pub oversize: AtomicU64,
    /// Authenticated, in-bounds datagrams handed to chitchat.
    pub received: AtomicU64,
    /// Messages sent, by kind: SYN (an exchange this node starts; each
    /// gossip round starts one with each peer it picks), SYN-ACK, ACK,
    /// and other (a bad-cluster answer).
    pub sent: [AtomicU64; 4],
}

impl GossipCounters {
    /// The kinds of [`GossipCounters::sent`], in its order.
    pub const SENT_KINDS: [&'static str; 4] = ["syn", "synack", "ack", "other"];
}

/// The ring a node seals and opens with, changeable while it runs (admin
/// API rotation), and what it dropped.
pub struct GossipKeys {
    ring: RwLock<Keyring>,
    nonces: NonceSource,
    /// The file a change is written to (so a restart keeps it).
    file: Option<std::path::PathBuf>,
    /// Dropped datagrams.
    pub counters: GossipCounters,
    /// What peers' digests say of this node (filled by the sealed
    /// transport, read by the gossip layer, which republishes over it).
    pub(crate) echo: super::bounds::SelfEcho,
    /// Gossip addresses confirmed (filled and probed by the sealed
    /// transport, read by the gossip layer, which dials only confirmed
    /// members).
    pub(crate) confirmed: super::confirm::Confirmed,
}

impl fmt::Debug for GossipKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GossipKeys")
            .field("keys", &self.ring().fingerprints())
            .finish()
    }
}

impl GossipKeys {
    /// Keys sealing with nonces from the OS generator (production).
    pub fn new(ring: Keyring) -> GossipKeys {
        GossipKeys {
            ring: RwLock::new(ring),
            nonces: NonceSource::System(ring::rand::SystemRandom::new()),
            file: None,
            counters: GossipCounters::default(),
            echo: super::bounds::SelfEcho::default(),
            confirmed: super::confirm::Confirmed::default(),
        }
    }

    /// Writes every change of the ring to `path` (the file it was read
    /// from), so a restarted node seals with the ring in force.
    pub fn with_file(mut self, path: std::path::PathBuf) -> GossipKeys {
        self.file = Some(path);
        self
    }

    /// Keys sealing with nonces drawn from `seed` (deterministic; for the
    /// simulation only: nonces of two rings with one seed repeat).
    pub fn seeded(ring: Keyring, seed: u64) -> GossipKeys {
        GossipKeys {
            ring: RwLock::new(ring),
            nonces: NonceSource::Seeded(Mutex::new(seed)),
            file: None,
            counters: GossipCounters::default(),
            echo: super::bounds::SelfEcho::default(),
            confirmed: super::confirm::Confirmed::default(),
        }
    }

    /// A copy of the current ring.
    pub fn ring(&self) -> Keyring {
        self.ring.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Changes the ring with `f` (all or nothing), writes it to the file
    /// when there is one, and returns the new ring.
    ///
    /// # Errors
    /// What `f` returns, or [`KeyringError::Write`]; the ring is then
    /// unchanged.
    pub fn update(
        &self,
        f: impl FnOnce(&mut Keyring) -> Result<(), KeyringError>,
    ) -> Result<Keyring, KeyringError> {
        let mut g = self.ring.write().unwrap_or_else(|p| p.into_inner());
        let mut next = g.clone();
        f(&mut next)?;
        if let Some(path) = &self.file {
            write_file(path, &next, false)?;
        }
        *g = next.clone();
        Ok(next)
    }

    /// A fresh nonce; `None` only when the OS generator fails.
    fn nonce(&self) -> Option<[u8; NONCE_LEN]> {
        let mut n = [0u8; NONCE_LEN];
        match &self.nonces {
            NonceSource::System(r) => r.fill(&mut n).ok()?,
            NonceSource::Seeded(s) => {
                let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
                for chunk in n.chunks_mut(8) {
                    *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
                    let mut z = *s;
                    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                    let z = (z ^ (z >> 31)).to_le_bytes();
                    chunk.copy_from_slice(&z[..chunk.len()]);
                }
            }
        }
        Some(n)
    }

    /// Seals `plain` with the sending key and a fresh nonce; `None` (the
    /// datagram is not sent) when the OS generator fails, since a repeated
    /// nonce would break the cipher.
    pub fn seal(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let nonce = self.nonce()?;
        Some(
            self.ring
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .seal(plain, nonce),
        )
    }

    /// Opens `sealed` with the ring, counting a failure in
    /// [`GossipCounters::unauthenticated`].
    pub fn open(&self, sealed: &[u8]) -> Option<Vec<u8>> {
        let r = self
            .ring
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .open(sealed);
        if r.is_none() {
            self.counters
                .unauthenticated
                .fetch_add(1, Ordering::Relaxed);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> GossipKey {
        GossipKey::from_bytes([b; KEY_LEN])
    }

    #[test]
    fn sealed_bytes_open_with_the_ring_and_not_without() {
        let ring = Keyring::single(key(1));
        let sealed = ring.seal(b"hello", [7; NONCE_LEN]);
        assert_eq!(sealed.len(), 5 + SEAL_OVERHEAD);
        assert_eq!(ring.open(&sealed).as_deref(), Some(&b"hello"[..]));
        assert_eq!(Keyring::single(key(2)).open(&sealed), None);
        // Any flipped bit fails authentication, format byte included.
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 0x01;
            assert_eq!(ring.open(&bad), None, "bit flipped at byte {i}");
        }
        assert_eq!(ring.open(&sealed[..SEAL_OVERHEAD - 1]), None);
        // A plain chitchat datagram (magic 0xB053 LE) is refused.
        assert_eq!(ring.open(&[0x53, 0xb0, 0, 2, 0, 0, 0, 0]), None);
    }

    #[test]
    fn every_key_of_the_ring_opens_only_the_first_seals() {
        let mut ring = Keyring::single(key(1));
        ring.install(key(2)).unwrap();
        let old = Keyring::single(key(1)).seal(b"a", [1; NONCE_LEN]);
        let new = Keyring::single(key(2)).seal(b"b", [1; NONCE_LEN]);
        assert_eq!(ring.open(&old).as_deref(), Some(&b"a"[..]));
        assert_eq!(ring.open(&new).as_deref(), Some(&b"b"[..]));
        assert_eq!(
            Keyring::single(key(1)).open(&ring.seal(b"c", [2; NONCE_LEN])),
            Some(b"c".to_vec())
        );
    }

    #[test]
    fn rotation_install_use_remove() {
        let mut ring = Keyring::single(key(1));
        let (fp1, fp2) = (key(1).fingerprint(), key(2).fingerprint());
        ring.install(key(2)).unwrap();
        ring.install(key(2)).unwrap();
        assert_eq!(ring.fingerprints(), vec![fp1.clone(), fp2.clone()]);
        assert!(matches!(
            ring.remove(&fp1),
            Err(KeyringError::RemoveSending(_))
        ));
        ring.use_key(&fp2).unwrap();
        ring.remove(&fp1).unwrap();
        assert_eq!(ring.fingerprints(), vec![fp2]);
        // A datagram sealed with the removed key no longer opens.
        assert_eq!(
            ring.open(&Keyring::single(key(1)).seal(b"x", [3; 12])),
            None
        );
        assert!(matches!(
            ring.use_key("00000000"),
            Err(KeyringError::Unknown(_))
        ));
        for b in 3..=(MAX_KEYS as u8) + 1 {
            ring.install(key(b)).unwrap();
        }
        assert!(matches!(
            ring.install(key(99)),
            Err(KeyringError::TooMany(_))
        ));
    }

    #[test]
    fn file_form_round_trips_and_bad_files_name_the_line() {
        let mut ring = Keyring::single(key(1));
        ring.install(key(2)).unwrap();
        assert_eq!(Keyring::parse(&ring.to_file_text()).unwrap(), ring);
        let text = format!("# c\n\n  {}  \n", key(3).to_base64());
        assert_eq!(Keyring::parse(&text).unwrap(), Keyring::single(key(3)));
        assert!(matches!(
            Keyring::parse("# only\n\n"),
            Err(KeyringError::Empty)
        ));
        let e = Keyring::parse(&format!("{}\nnot-base64!\n", key(1).to_base64())).unwrap_err();
        assert!(matches!(e, KeyringError::BadKey { line: 2, .. }), "{e}");
        let short = STANDARD.encode([0u8; 16]);
        let e = Keyring::parse(&short).unwrap_err();
        assert!(e.to_string().contains("16 bytes"), "{e}");
        let many: String = (1..=(MAX_KEYS as u8 + 1))
            .map(|b| key(b).to_base64() + "\n")
            .collect();
        assert!(matches!(
            Keyring::parse(&many),
            Err(KeyringError::TooMany(9))
        ));
    }

    #[test]
    fn files_are_created_once_with_mode_0600() {
        let dir = std::env::temp_dir().join(format!("peerlb-keyring-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("gossip.keys");
        assert!(create_file(&p).unwrap());
        let first = Keyring::load(&p).unwrap();
        assert!(!create_file(&p).unwrap());
        assert_eq!(Keyring::load(&p).unwrap(), first);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
        let mut next = first.clone();
        next.install(key(5)).unwrap();
        write_file(&p, &next, false).unwrap();
        assert_eq!(Keyring::load(&p).unwrap(), next);
        assert!(matches!(
            Keyring::load(&dir.join("missing")),
            Err(KeyringError::Read { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn seeded_nonces_repeat_per_seed_and_differ_per_datagram() {
        let a = GossipKeys::seeded(Keyring::single(key(1)), 42);
        let b = GossipKeys::seeded(Keyring::single(key(1)), 42);
        let (a1, a2) = (a.seal(b"m").unwrap(), a.seal(b"m").unwrap());
        assert_eq!(a1, b.seal(b"m").unwrap());
        assert_ne!(a1, a2);
        let sys = GossipKeys::new(Keyring::single(key(1)));
        assert_ne!(sys.seal(b"m"), sys.seal(b"m"));
        assert_eq!(a.open(&a2).as_deref(), Some(&b"m"[..]));
        assert_eq!(a.counters.unauthenticated.load(Ordering::Relaxed), 0);
        assert_eq!(a.open(b"forged"), None);
        assert_eq!(a.counters.unauthenticated.load(Ordering::Relaxed), 1);
    }
}
