//! TLS termination: certificates from Secrets turned into rustls keys,
//! and the per-port resolver that picks one by SNI (the most specific
//! listener hostname that matches; without SNI, the first). A table swap
//! brings new certificates to new handshakes; established connections
//! keep theirs.

use std::sync::Arc;

use rustls::crypto::ring::sign::any_supported_type;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::model::hosts::Host;
use crate::model::Certificate;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("tls.crt holds no PEM certificate")]
    NoCertificate,
    #[error("tls.key holds no PEM private key")]
    NoKey,
    #[error("tls.key: {0}")]
    BadKey(String),
    #[error("tls.crt does not belong to tls.key")]
    Mismatch,
}

/// The rustls key for a PEM chain and key, checked to belong together.
pub fn certified(chain_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain_pem)
        .filter_map(Result::ok)
        .collect();
    if chain.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|_| TlsError::NoKey)?;
    let signer = any_supported_type(&key).map_err(|e| TlsError::BadKey(e.to_string()))?;
    let ck = CertifiedKey::new(chain, signer);
    match ck.keys_match() {
        Ok(()) => Ok(ck),
        // A key whose public half rustls cannot extract is let through.
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(ck),
        Err(_) => Err(TlsError::Mismatch),
    }
}

/// Whether a Secret's pair is usable (the builder's check).
pub fn check_pair(chain_pem: &[u8], key_pem: &[u8]) -> Result<(), TlsError> {
    certified(chain_pem, key_pem).map(|_| ())
}

/// One port's certificates, most specific host first.
#[derive(Debug, Default)]
pub struct Resolver {
    certs: Vec<(Host, Arc<CertifiedKey>)>,
}

impl Resolver {
    pub fn new(certs: &[Certificate]) -> Resolver {
        let certs = certs
            .iter()
            .filter_map(|c| {
                Some((
                    c.host.clone(),
                    Arc::new(certified(&c.chain_pem, &c.key_pem).ok()?),
                ))
            })
            .collect();
        Resolver { certs }
    }

    pub fn is_empty(&self) -> bool {
        self.certs.is_empty()
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        match hello.server_name() {
            Some(sni) => {
                let sni = sni.to_ascii_lowercase();
                self.certs
                    .iter()
                    .find(|(h, _)| h.matches(&sni))
                    .map(|(_, c)| c.clone())
            }
            None => self.certs.first().map(|(_, c)| c.clone()),
        }
    }
}

/// A server config for a port, with HTTP/2 and HTTP/1.1 offered by ALPN.
pub fn server_config(r: Arc<Resolver>) -> Arc<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default versions")
        .with_no_client_auth()
        .with_cert_resolver(r);
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(cfg)
}
