//! Encryption at rest of endpoint signing secrets.
//!
//! One entry point, [`Keyring`]: the active key (encrypts) and older keys (decrypt
//! during a rotation, until `hookd rekey` has moved every row to the active key).
//!
//! - **AEAD:** XChaCha20-Poly1305 (RustCrypto `chacha20poly1305`). Its 192-bit nonce can
//!   be drawn at random for every row with no counter and no birthday bound to track
//!   (AES-GCM's 96-bit random nonce is safe only up to about 2^32 encryptions per key),
//!   and it is constant-time in software on every CPU, with or without AES instructions.
//! - **Stored form:** `ciphertext` = 24-byte random nonce ‖ ciphertext ‖ 16-byte tag, and
//!   the key id beside it in its own column.
//! - **Associated data:** a version label, the endpoint id and the key id. A ciphertext
//!   copied onto another endpoint's row, or relabelled with another key id, fails
//!   authentication instead of signing someone else's webhooks.
//! - **Fingerprints:** change detection ("is this the secret we already store?") uses
//!   HMAC-SHA256 under a subkey derived from each encryption key, over the endpoint id
//!   and the secret. A bare SHA-256 would let anyone holding a database dump confirm a
//!   guessed secret; `whsec_` secrets are 24+ random bytes, so guessing is hopeless for
//!   them, but the keyed form costs nothing and stays safe for a weak secret someone
//!   typed by hand. The endpoint id in the input means two endpoints sharing a secret
//!   cannot be linked by their fingerprints.
//!
//! No `Debug` or error message in this module ever contains key material or a secret.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hmac::{Hmac, Mac};
use rand::TryRngCore;
use sha2::Sha256;
use uuid::Uuid;
use zeroize::Zeroizing;

type HmacSha256 = Hmac<Sha256>;

const KEY_LEN: usize = 32;
const NONCE_LEN: usize = 24;
const TAG_LEN: usize = 16;
/// Bumped if the associated-data layout ever changes, so old and new rows cannot be
/// confused.
const AAD_LABEL: &[u8] = b"hookd/endpoint_secret/v1";
const FINGERPRINT_LABEL: &[u8] = b"hookd/endpoint_secret_fingerprint/v1";
const MAX_KEY_ID_LEN: usize = 64;

/// Why a key could not be loaded. Messages name the variable and the key id, never any
/// part of the key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    #[error(
        "{source_name} is not of the form <key-id>:<base64 of 32 bytes> (key id: 1-64 letters, digits, '.', '_' or '-')"
    )]
    Format { source_name: String },
    #[error("{source_name}: key {key_id:?} is not valid base64")]
    NotBase64 { source_name: String, key_id: String },
    #[error("{source_name}: key {key_id:?} must decode to 32 bytes, got {len}")]
    Length {
        source_name: String,
        key_id: String,
        len: usize,
    },
    #[error(
        "key id {0:?} is configured twice (HOOKD_ENCRYPTION_KEY and HOOKD_ENCRYPTION_OLD_KEYS must use distinct ids)"
    )]
    DuplicateId(String),
}

/// Why a stored secret could not be decrypted.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DecryptError {
    #[error(
        "it is encrypted with key {0:?}, which is not configured (add it to HOOKD_ENCRYPTION_OLD_KEYS until `hookd rekey` has run)"
    )]
    UnknownKey(String),
    #[error(
        "authentication failed under key {0:?}: the key is wrong, or the ciphertext was altered or moved from another endpoint"
    )]
    Authentication(String),
    #[error("the decrypted secret is not UTF-8 text")]
    NotText,
}

/// A secret sealed for one endpoint's row.
#[derive(Clone, PartialEq, Eq)]
pub struct Sealed {
    pub key_id: String,
    /// nonce ‖ ciphertext ‖ tag
    pub ciphertext: Vec<u8>,
}

impl fmt::Debug for Sealed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Sealed {{ key_id: {:?}, ciphertext: {} bytes }}",
            self.key_id,
            self.ciphertext.len()
        )
    }
}

// Clone: `hookd dev` loads its keyring once and hands a copy to each component it runs
// (each load reads the key file again and repeats its warnings).
#[derive(Clone)]
struct Key {
    id: String,
    aead: XChaCha20Poly1305,
    fingerprint: HmacSha256,
}

/// The active key and the older keys still accepted for decryption.
#[derive(Clone)]
pub struct Keyring {
    active: Key,
    /// every key, the active one included, by id
    by_id: HashMap<String, usize>,
    older: Vec<Key>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("active", &self.active.id)
            .field(
                "older",
                &self.older.iter().map(|k| k.id.as_str()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

fn valid_key_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_KEY_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Parses `<key-id>:<base64 of 32 bytes>`. `source_name` labels errors (e.g. the
/// variable name); the text itself is never echoed.
pub fn parse_key(
    source_name: &str,
    text: &str,
) -> Result<(String, Zeroizing<[u8; KEY_LEN]>), KeyError> {
    let format = || KeyError::Format {
        source_name: source_name.to_string(),
    };
    let (id, b64) = text.trim().split_once(':').ok_or_else(format)?;
    if !valid_key_id(id) {
        return Err(format());
    }
    let bytes = Zeroizing::new(
        STANDARD
            .decode(b64.trim())
            .map_err(|_| KeyError::NotBase64 {
                source_name: source_name.to_string(),
                key_id: id.to_string(),
            })?,
    );
    if bytes.len() != KEY_LEN {
        return Err(KeyError::Length {
            source_name: source_name.to_string(),
            key_id: id.to_string(),
            len: bytes.len(),
        });
    }
    let mut key = Zeroizing::new([0u8; KEY_LEN]);
    key.copy_from_slice(&bytes);
    Ok((id.to_string(), key))
}

/// A fresh random key in the configuration format, `<key_id>:<base64>`.
pub fn generate_key_text(key_id: &str) -> Zeroizing<String> {
    let mut key = Zeroizing::new([0u8; KEY_LEN]);
    fill_random(&mut key[..]);
    Zeroizing::new(format!("{key_id}:{}", STANDARD.encode(&key[..])))
}

fn fill_random(buf: &mut [u8]) {
    // The OS generator failing means the machine cannot produce keys or nonces at all;
    // carrying on with a predictable nonce would be far worse than stopping.
    rand::rngs::OsRng
        .try_fill_bytes(buf)
        .expect("the operating system's random number generator failed");
}

impl Key {
    fn new(id: String, bytes: &[u8; KEY_LEN]) -> Key {
        let aead = XChaCha20Poly1305::new(bytes.into());
        // Subkey for fingerprints: HMAC(key, label). Deriving it keeps the AEAD key from
        // ever being used as a MAC key directly.
        let mut derive =
            <HmacSha256 as Mac>::new_from_slice(bytes).expect("HMAC accepts keys of any length");
        derive.update(FINGERPRINT_LABEL);
        let sub: Zeroizing<[u8; 32]> = Zeroizing::new(derive.finalize().into_bytes().into());
        let fingerprint =
            <HmacSha256 as Mac>::new_from_slice(&sub[..]).expect("HMAC accepts keys of any length");
        Key {
            id,
            aead,
            fingerprint,
        }
    }

    fn fingerprint(&self, endpoint_id: Uuid, secret: &str) -> Vec<u8> {
        let mut mac = self.fingerprint.clone();
        mac.update(endpoint_id.as_bytes());
        mac.update(secret.as_bytes());
        mac.finalize().into_bytes().to_vec()
    }
}

fn aad(endpoint_id: Uuid, key_id: &str) -> Vec<u8> {
    let mut aad = Vec::with_capacity(AAD_LABEL.len() + 16 + 1 + key_id.len());
    aad.extend_from_slice(AAD_LABEL);
    aad.extend_from_slice(endpoint_id.as_bytes());
    aad.push(0);
    aad.extend_from_slice(key_id.as_bytes());
    aad
}

impl Keyring {
    /// A keyring from configuration text: `active` is `<key-id>:<base64>`, `older` a
    /// comma-separated list in the same format (may be empty). `*_name` label errors.
    pub fn from_config(
        active_name: &str,
        active: &str,
        older_name: &str,
        older: &str,
    ) -> Result<Keyring, KeyError> {
        let (id, bytes) = parse_key(active_name, active)?;
        let mut ring = Keyring {
            by_id: HashMap::from([(id.clone(), 0)]),
            active: Key::new(id, &bytes),
            older: Vec::new(),
        };
        for entry in older.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (id, bytes) = parse_key(older_name, entry)?;
            if ring.by_id.contains_key(&id) {
                return Err(KeyError::DuplicateId(id));
            }
            ring.older.push(Key::new(id.clone(), &bytes));
            ring.by_id.insert(id, ring.older.len());
        }
        Ok(ring)
    }

    /// The id new ciphertexts are written under.
    pub fn active_key_id(&self) -> &str {
        &self.active.id
    }

    /// Every configured key id, the active one first.
    pub fn key_ids(&self) -> Vec<&str> {
        std::iter::once(self.active.id.as_str())
            .chain(self.older.iter().map(|k| k.id.as_str()))
            .collect()
    }

    fn key(&self, id: &str) -> Option<&Key> {
        match self.by_id.get(id)? {
            0 => Some(&self.active),
            i => self.older.get(i - 1),
        }
    }

    /// Seals `secret` for `endpoint_id` under the active key, with a fresh random nonce.
    pub fn encrypt(&self, endpoint_id: Uuid, secret: &str) -> Sealed {
        let key = &self.active;
        let mut nonce = [0u8; NONCE_LEN];
        fill_random(&mut nonce);
        let sealed = key
            .aead
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: secret.as_bytes(),
                    aad: &aad(endpoint_id, &key.id),
                },
            )
            // XChaCha20-Poly1305 only refuses messages longer than 256 GiB.
            .expect("a signing secret is far below the AEAD's message limit");
        let mut ciphertext = Vec::with_capacity(NONCE_LEN + sealed.len());
        ciphertext.extend_from_slice(&nonce);
        ciphertext.extend_from_slice(&sealed);
        Sealed {
            key_id: key.id.clone(),
            ciphertext,
        }
    }

    /// Opens a secret stored on `endpoint_id`'s row under `key_id`.
    pub fn decrypt(
        &self,
        endpoint_id: Uuid,
        key_id: &str,
        ciphertext: &[u8],
    ) -> Result<Zeroizing<String>, DecryptError> {
        let key = self
            .key(key_id)
            .ok_or_else(|| DecryptError::UnknownKey(key_id.to_string()))?;
        if ciphertext.len() < NONCE_LEN + TAG_LEN {
            return Err(DecryptError::Authentication(key_id.to_string()));
        }
        let (nonce, sealed) = ciphertext.split_at(NONCE_LEN);
        let plain = Zeroizing::new(
            key.aead
                .decrypt(
                    XNonce::from_slice(nonce),
                    Payload {
                        msg: sealed,
                        aad: &aad(endpoint_id, key_id),
                    },
                )
                .map_err(|_| DecryptError::Authentication(key_id.to_string()))?,
        );
        match std::str::from_utf8(&plain) {
            Ok(s) => Ok(Zeroizing::new(s.to_string())),
            Err(_) => Err(DecryptError::NotText),
        }
    }

    /// The fingerprint of `secret` on `endpoint_id` under the active key (stored with
    /// the ciphertext).
    pub fn fingerprint(&self, endpoint_id: Uuid, secret: &str) -> Vec<u8> {
        self.active.fingerprint(endpoint_id, secret)
    }

    /// (key id, fingerprint) under every configured key: a stored secret written under
    /// an older key, not yet rekeyed, is still recognised as unchanged.
    pub fn fingerprints(&self, endpoint_id: Uuid, secret: &str) -> Vec<(String, Vec<u8>)> {
        std::iter::once(&self.active)
            .chain(&self.older)
            .map(|k| (k.id.clone(), k.fingerprint(endpoint_id, secret)))
            .collect()
    }
}

/// Where the keys come from (see `config::KeyArgs`); the environment is passed in so
/// the fallback rules can be tested.
#[derive(Clone, Default)]
pub struct KeySources<'a> {
    /// HOOKD_ENCRYPTION_KEY
    pub key: Option<&'a str>,
    /// HOOKD_ENCRYPTION_OLD_KEYS
    pub old_keys: &'a str,
    /// HOOKD_ENCRYPTION_KEY_FILE
    pub key_file: Option<PathBuf>,
    pub xdg_data_home: Option<PathBuf>,
    pub home: Option<PathBuf>,
    /// KUBERNETES_SERVICE_HOST is set
    pub in_cluster: bool,
}

/// Why no keyring could be loaded. Never contains key material.
#[derive(Debug, thiserror::Error)]
pub enum KeyConfigError {
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(
        "HOOKD_ENCRYPTION_KEY is not set and the local key file {path} cannot be created ({error}); set HOOKD_ENCRYPTION_KEY=<key-id>:<base64 of 32 bytes> (in Kubernetes from Secret hookd-encryption, key `key`), or HOOKD_ENCRYPTION_KEY_FILE to a writable path"
    )]
    CreateFile {
        path: PathBuf,
        // not a #[source]: the message already says it, and error chains would repeat it
        error: std::io::Error,
    },
    #[error("cannot read the encryption key file {path} ({error})")]
    ReadFile {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "HOOKD_ENCRYPTION_KEY is not set and there is no place for a local key file (HOOKD_ENCRYPTION_KEY_FILE, XDG_DATA_HOME and HOME are unset); set HOOKD_ENCRYPTION_KEY=<key-id>:<base64 of 32 bytes>"
    )]
    NoLocation,
    #[error(
        "HOOKD_ENCRYPTION_KEY is not set, and this process runs in Kubernetes, where a generated local key would differ from pod to pod; set HOOKD_ENCRYPTION_KEY from Secret hookd-encryption (key `key`), or point HOOKD_ENCRYPTION_KEY_FILE at a mounted key file"
    )]
    InCluster,
}

/// The default local key file: `$XDG_DATA_HOME/hookd/encryption-key`, else
/// `~/.local/share/hookd/encryption-key`.
pub fn default_key_file(xdg_data_home: Option<&Path>, home: Option<&Path>) -> Option<PathBuf> {
    // The XDG spec ignores a relative XDG_DATA_HOME.
    let base = xdg_data_home
        .filter(|p| p.is_absolute())
        .map(Path::to_path_buf)
        .or_else(|| home.map(|h| h.join(".local").join("share")))?;
    Some(base.join("hookd").join("encryption-key"))
}

/// Loads the keyring: HOOKD_ENCRYPTION_KEY when set; otherwise the local key file,
/// created with a random key on first use. Logs a warning whenever the key file is used,
/// since a key living beside the process is for one machine, not for production.
pub fn load_keyring(src: KeySources<'_>) -> Result<Keyring, KeyConfigError> {
    if let Some(key) = src.key.filter(|k| !k.trim().is_empty()) {
        return Ok(Keyring::from_config(
            "HOOKD_ENCRYPTION_KEY",
            key,
            "HOOKD_ENCRYPTION_OLD_KEYS",
            src.old_keys,
        )?);
    }
    let explicit = src.key_file.is_some();
    if src.in_cluster && !explicit {
        return Err(KeyConfigError::InCluster);
    }
    let path = src
        .key_file
        .or_else(|| default_key_file(src.xdg_data_home.as_deref(), src.home.as_deref()))
        .ok_or(KeyConfigError::NoLocation)?;
    let (text, created) = read_or_create_key_file(&path)?;
    let label = format!("key file {}", path.display());
    let ring = Keyring::from_config(&label, &text, "HOOKD_ENCRYPTION_OLD_KEYS", src.old_keys)?;
    if created {
        tracing::warn!(
            path = %path.display(),
            key_id = ring.active_key_id(),
            "HOOKD_ENCRYPTION_KEY is not set: created a local encryption key file (mode 0600) for signing secrets; fine on a laptop, but production must set HOOKD_ENCRYPTION_KEY (Secret hookd-encryption), and every process sharing this database needs the same key"
        );
    } else if !explicit {
        tracing::warn!(
            path = %path.display(),
            key_id = ring.active_key_id(),
            "HOOKD_ENCRYPTION_KEY is not set: using the local encryption key file; production must set HOOKD_ENCRYPTION_KEY (Secret hookd-encryption)"
        );
    }
    Ok(ring)
}

/// Reads the key file, or creates it with a fresh key. Creation is atomic and never
/// clobbers: the key is written to a private temporary file, synced, then hard-linked
/// into place, so two processes starting at once agree on one key and no reader ever
/// sees a half-written file.
fn read_or_create_key_file(path: &Path) -> Result<(Zeroizing<String>, bool), KeyConfigError> {
    let read = |path: &Path| {
        std::fs::read_to_string(path)
            .map(Zeroizing::new)
            .map_err(|error| KeyConfigError::ReadFile {
                path: path.to_path_buf(),
                error,
            })
    };
    match std::fs::metadata(path) {
        Ok(meta) => {
            warn_if_readable_by_others(path, &meta);
            return Ok((read(path)?, false));
        }
        // missing, or a path component is not a directory: try to create it, which
        // reports why it cannot be
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) => {}
        Err(error) => {
            return Err(KeyConfigError::ReadFile {
                path: path.to_path_buf(),
                error,
            });
        }
    }
    let create_err = |error| KeyConfigError::CreateFile {
        path: path.to_path_buf(),
        error,
    };
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(create_err)?;

    let mut suffix = [0u8; 4];
    fill_random(&mut suffix);
    let id = format!(
        "local-{}",
        suffix
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let tmp = dir.join(format!(".encryption-key.{id}.tmp"));
    let text = generate_key_text(&id);
    let written = (|| {
        use std::io::Write;
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let mut f = opts.open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(create_err(e));
    }
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok((text, true)),
        // another process created it first: use theirs
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok((read(path)?, false)),
        Err(e) => Err(create_err(e)),
    }
}

fn warn_if_readable_by_others(path: &Path, meta: &std::fs::Metadata) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode();
        if meta.is_file() && mode & 0o077 != 0 {
            tracing::warn!(
                path = %path.display(),
                mode = format!("{:o}", mode & 0o777),
                "the encryption key file is readable by other users; chmod 600 it"
            );
        }
    }
    #[cfg(not(unix))]
    let _ = (path, meta);
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "k1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    const K2: &str = "k2:Hx4dHBsaGRgXFhUUExIREA8ODQwLCgkIBwYFBAMCAQA=";
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn ring(active: &str, older: &str) -> Keyring {
        Keyring::from_config(
            "HOOKD_ENCRYPTION_KEY",
            active,
            "HOOKD_ENCRYPTION_OLD_KEYS",
            older,
        )
        .unwrap()
    }

    #[test]
    fn round_trip_with_a_fresh_nonce_each_time() {
        let r = ring(K1, "");
        let ep = Uuid::now_v7();
        let a = r.encrypt(ep, SECRET);
        let b = r.encrypt(ep, SECRET);
        assert_eq!(a.key_id, "k1");
        assert_ne!(a.ciphertext, b.ciphertext, "random nonce per encryption");
        assert_eq!(a.ciphertext.len(), NONCE_LEN + SECRET.len() + TAG_LEN);
        assert_eq!(&*r.decrypt(ep, "k1", &a.ciphertext).unwrap(), SECRET);
        assert_eq!(&*r.decrypt(ep, "k1", &b.ciphertext).unwrap(), SECRET);
        // nothing of the secret is visible in the sealed bytes
        let hay = String::from_utf8_lossy(&a.ciphertext);
        assert!(!hay.contains("whsec_") && !hay.contains("MfKQ9r8"));
    }

    #[test]
    fn ciphertext_is_bound_to_its_endpoint_and_key_id() {
        let r = ring(K1, K2);
        let (ep, other) = (Uuid::now_v7(), Uuid::now_v7());
        let s = r.encrypt(ep, SECRET);
        assert_eq!(
            r.decrypt(other, "k1", &s.ciphertext),
            Err(DecryptError::Authentication("k1".into()))
        );
        assert_eq!(
            r.decrypt(ep, "k2", &s.ciphertext),
            Err(DecryptError::Authentication("k2".into()))
        );
        let mut tampered = s.ciphertext.clone();
        *tampered.last_mut().unwrap() ^= 1;
        assert!(r.decrypt(ep, "k1", &tampered).is_err());
        assert!(r.decrypt(ep, "k1", &s.ciphertext[..10]).is_err());
    }

    #[test]
    fn older_keys_decrypt_and_unknown_keys_are_named() {
        let old = ring(K1, "");
        let ep = Uuid::now_v7();
        let s = old.encrypt(ep, SECRET);
        let rotated = ring(K2, K1);
        assert_eq!(rotated.active_key_id(), "k2");
        assert_eq!(rotated.key_ids(), vec!["k2", "k1"]);
        assert_eq!(&*rotated.decrypt(ep, "k1", &s.ciphertext).unwrap(), SECRET);
        assert_eq!(rotated.encrypt(ep, SECRET).key_id, "k2");
        let only_new = ring(K2, "");
        let err = only_new.decrypt(ep, "k1", &s.ciphertext).unwrap_err();
        assert_eq!(err, DecryptError::UnknownKey("k1".into()));
        assert!(err.to_string().contains("HOOKD_ENCRYPTION_OLD_KEYS"));
    }

    #[test]
    fn fingerprints_are_keyed_and_per_endpoint() {
        let r = ring(K2, K1);
        let (ep, other) = (Uuid::now_v7(), Uuid::now_v7());
        let fps = r.fingerprints(ep, SECRET);
        assert_eq!(fps.len(), 2);
        assert_eq!(fps[0], ("k2".to_string(), r.fingerprint(ep, SECRET)));
        assert_eq!(fps[1].1, ring(K1, "").fingerprint(ep, SECRET));
        assert_ne!(fps[0].1, fps[1].1);
        assert_ne!(r.fingerprint(ep, SECRET), r.fingerprint(other, SECRET));
        use sha2::Digest;
        assert_ne!(fps[0].1, Sha256::digest(SECRET.as_bytes()).to_vec());
    }

    #[test]
    fn bad_keys_are_refused_without_echoing_them() {
        let cases = [
            (
                "no-colon-AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
                "is not of the form",
            ),
            (
                ":AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
                "is not of the form",
            ),
            (
                "bad id:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
                "is not of the form",
            ),
            ("k1:not*base64*at*all", "is not valid base64"),
            (
                "k1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwd",
                "must decode to 32 bytes, got 30",
            ),
        ];
        for (text, want) in cases {
            let err = Keyring::from_config("HOOKD_ENCRYPTION_KEY", text, "OLD", "")
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{text}: {err}");
            assert!(err.contains("HOOKD_ENCRYPTION_KEY"), "{err}");
            let key_part = text.rsplit(':').next().unwrap();
            assert!(!err.contains(key_part), "error echoes the key: {err}");
        }
        let dup = Keyring::from_config("A", K1, "B", K1).unwrap_err();
        assert_eq!(dup, KeyError::DuplicateId("k1".into()));
        let bad_old =
            Keyring::from_config("A", K1, "HOOKD_ENCRYPTION_OLD_KEYS", "k2:zz").unwrap_err();
        assert!(bad_old.to_string().starts_with("HOOKD_ENCRYPTION_OLD_KEYS"));
    }

    #[test]
    fn debug_never_prints_key_material() {
        let r = ring(K1, K2);
        let dbg = format!("{r:?}");
        assert_eq!(dbg, r#"Keyring { active: "k1", older: ["k2"] }"#);
        let s = r.encrypt(Uuid::now_v7(), SECRET);
        assert!(!format!("{s:?}").contains(&format!("{:?}", s.ciphertext)));
    }

    #[test]
    fn generated_keys_parse() {
        let text = generate_key_text("local-1");
        let (id, _) = parse_key("file", &text).unwrap();
        assert_eq!(id, "local-1");
        assert_ne!(*generate_key_text("x"), *generate_key_text("x"));
    }

    fn temp_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("hookd-crypto-test-{}", Uuid::now_v7().simple()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn environment_key_wins_over_the_key_file() {
        let dir = temp_dir();
        let ring = load_keyring(KeySources {
            key: Some(K2),
            old_keys: K1,
            key_file: Some(dir.join("never-created")),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(ring.key_ids(), vec!["k2", "k1"]);
        assert!(!dir.join("never-created").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn key_file_is_created_private_once_and_reused() {
        let dir = temp_dir();
        let xdg = dir.join("xdg");
        let sources = KeySources {
            xdg_data_home: Some(xdg.clone()),
            home: Some(dir.join("home")),
            ..Default::default()
        };
        let first = load_keyring(sources.clone()).unwrap();
        let path = xdg.join("hookd").join("encryption-key");
        assert!(path.is_file());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let second = load_keyring(sources).unwrap();
        assert_eq!(first.active_key_id(), second.active_key_id());
        assert!(first.active_key_id().starts_with("local-"));
        let ep = Uuid::now_v7();
        let sealed = first.encrypt(ep, SECRET);
        assert_eq!(
            &*second
                .decrypt(ep, &sealed.key_id, &sealed.ciphertext)
                .unwrap(),
            SECRET
        );
        // no temporary files are left behind
        assert_eq!(std::fs::read_dir(xdg.join("hookd")).unwrap().count(), 1);

        // without XDG_DATA_HOME, under HOME
        let home_ring = load_keyring(KeySources {
            home: Some(dir.join("home")),
            ..Default::default()
        })
        .unwrap();
        assert!(dir.join("home/.local/share/hookd/encryption-key").is_file());
        assert_ne!(home_ring.active_key_id(), first.active_key_id());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn key_file_that_cannot_be_created_is_a_clear_error() {
        let dir = temp_dir();
        // a regular file where a directory is needed fails even for root
        let blocker = dir.join("not-a-dir");
        std::fs::write(&blocker, "x").unwrap();
        let err = load_keyring(KeySources {
            key_file: Some(blocker.join("hookd/encryption-key")),
            ..Default::default()
        })
        .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, KeyConfigError::CreateFile { .. }), "{msg}");
        assert!(
            msg.contains("cannot be created") && msg.contains("HOOKD_ENCRYPTION_KEY="),
            "{msg}"
        );
        assert!(msg.contains(&blocker.display().to_string()), "{msg}");

        assert!(matches!(
            load_keyring(KeySources::default()),
            Err(KeyConfigError::NoLocation)
        ));
        assert!(matches!(
            load_keyring(KeySources {
                home: Some(dir.clone()),
                in_cluster: true,
                ..Default::default()
            }),
            Err(KeyConfigError::InCluster)
        ));
        // a corrupt key file is refused, naming the file, never echoing its content
        let bad = dir.join("bad-key");
        std::fs::write(&bad, "k9:c2VjcmV0LWJ1dC1zaG9ydA==\n").unwrap();
        let msg = load_keyring(KeySources {
            key_file: Some(bad.clone()),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(
            msg.contains(&bad.display().to_string()) && msg.contains("32 bytes"),
            "{msg}"
        );
        assert!(!msg.contains("c2VjcmV0"), "{msg}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
