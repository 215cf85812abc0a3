//! Fetching image URLs over HTTP(S), only when the caller built a [`Fetcher`].
//!
//! Without a filter the fetcher connects anywhere, as the official's does. With one, every
//! connection is checked after DNS resolution: the resolver hands the client only the addresses
//! the filter allows (so a name that re-resolves to another address between check and connect
//! cannot slip through), IP-literal hosts are checked directly, and redirects are followed by
//! hand so each hop passes the same check. [`public_only`] is a filter for untrusted URLs.

use std::io::Read;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reqwest::blocking::Client;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::redirect::Policy;
use url::{Host, Url};

use crate::error::ImageError;

/// Decides whether the fetcher may connect to `addr`, resolved for `host`.
pub trait DestinationFilter: Send + Sync {
    fn allow(&self, host: &str, addr: IpAddr) -> bool;
}

impl<F: Fn(&str, IpAddr) -> bool + Send + Sync> DestinationFilter for F {
    fn allow(&self, host: &str, addr: IpAddr) -> bool {
        self(host, addr)
    }
}

/// The default per-image size limit: 32 MiB, as the official.
pub const DEFAULT_MAX_BYTES: usize = 32 * 1024 * 1024;
/// Redirect hops followed before giving up.
const MAX_REDIRECTS: usize = 10;
const TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// An HTTP(S) image fetcher (the official's `ReqwestImageFetcher`).
#[derive(Clone)]
pub struct Fetcher {
    max_bytes: usize,
    timeout: Duration,
    filter: Option<Arc<dyn DestinationFilter>>,
}

impl Default for Fetcher {
    fn default() -> Self {
        Fetcher::new()
    }
}

impl Fetcher {
    pub fn new() -> Self {
        Fetcher {
            max_bytes: DEFAULT_MAX_BYTES,
            timeout: TIMEOUT,
            filter: None,
        }
    }
    pub fn with_max_bytes(max_bytes: usize) -> Self {
        Fetcher {
            max_bytes,
            ..Fetcher::new()
        }
    }
    /// This fetcher, connecting only to the addresses `filter` allows.
    pub fn with_destination_filter(&self, filter: Arc<dyn DestinationFilter>) -> Self {
        Fetcher {
            filter: Some(filter),
            ..self.clone()
        }
    }
    /// This fetcher with another overall time limit per fetch (connect, redirects and body).
    pub fn with_timeout(&self, timeout: Duration) -> Self {
        Fetcher {
            timeout,
            ..self.clone()
        }
    }
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// The body at `url`, following redirects; `location` prefixes error messages.
    pub fn fetch(&self, url: &str, location: &str) -> Result<Vec<u8>, ImageError> {
        let fetch_err = || ImageError::Fetch {
            location: location.to_string(),
            url: url.to_string(),
        };
        let rejected = || ImageError::DestinationRejected {
            location: location.to_string(),
            url: url.to_string(),
        };
        let mut current = http_url(url).ok_or_else(fetch_err)?;
        let flag = Arc::new(AtomicBool::new(false));
        let mut builder = Client::builder()
            .redirect(Policy::none())
            .timeout(self.timeout)
            .connect_timeout(CONNECT_TIMEOUT.min(self.timeout));
        if let Some(filter) = &self.filter {
            // A proxy would connect on our behalf to addresses the filter never saw.
            builder = builder.no_proxy().dns_resolver(Arc::new(FilteringResolver {
                filter: filter.clone(),
                rejected: flag.clone(),
            }));
        }
        let client = builder
            .build()
            .map_err(|e| ImageError::Client(e.to_string()))?;
        let deadline = std::time::Instant::now() + self.timeout;
        for _ in 0..=MAX_REDIRECTS {
            if let Some(filter) = &self.filter {
                if let Some(ip) = literal_ip(&current) {
                    if !filter.allow(&ip.to_string(), ip) {
                        return Err(rejected());
                    }
                }
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(fetch_err());
            }
            let response = client
                .get(current.clone())
                .timeout(left)
                .send()
                .map_err(|_| {
                    if flag.load(Ordering::SeqCst) {
                        rejected()
                    } else {
                        fetch_err()
                    }
                })?;
            let status = response.status();
            if status.is_redirection() {
                let next = response
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| current.join(v).ok())
                    .ok_or_else(fetch_err)?;
                if !matches!(next.scheme(), "http" | "https") {
                    return Err(fetch_err());
                }
                current = next;
                continue;
            }
            if !status.is_success() {
                return Err(ImageError::FetchStatus {
                    location: location.to_string(),
                    url: url.to_string(),
                    status: status.as_u16(),
                });
            }
            let too_large = || ImageError::ImageTooLarge {
                location: location.to_string(),
                max_mb: self.max_bytes / (1024 * 1024),
            };
            if response
                .content_length()
                .is_some_and(|n| n > self.max_bytes as u64)
            {
                return Err(too_large());
            }
            let mut body = Vec::new();
            response
                .take(self.max_bytes as u64 + 1)
                .read_to_end(&mut body)
                .map_err(|_| fetch_err())?;
            if body.len() > self.max_bytes {
                return Err(too_large());
            }
            return Ok(body);
        }
        Err(fetch_err())
    }
}

/// `url` when it is an absolute http(s) URL with a host. The official reports any other URL
/// handed to its fetcher as a failed download, and so does [`Fetcher::fetch`].
pub fn http_url(url: &str) -> Option<Url> {
    Url::parse(url)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
}

fn literal_ip(url: &Url) -> Option<IpAddr> {
    match url.host()? {
        Host::Ipv4(a) => Some(IpAddr::V4(a)),
        Host::Ipv6(a) => Some(IpAddr::V6(a)),
        Host::Domain(_) => None,
    }
}

/// Resolves with the system resolver and keeps only allowed addresses; records a rejection so
/// the fetch reports `DestinationRejected` rather than a connection failure.
struct FilteringResolver {
    filter: Arc<dyn DestinationFilter>,
    rejected: Arc<AtomicBool>,
}

impl Resolve for FilteringResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let filter = self.filter.clone();
        let rejected = self.rejected.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            // getaddrinfo blocks; the blocking client runs this on its own runtime thread, one
            // request at a time, so nothing else waits behind it.
            let resolved: Vec<SocketAddr> = (host.as_str(), 0).to_socket_addrs()?.collect();
            let allowed: Vec<SocketAddr> = resolved
                .into_iter()
                .filter(|a| filter.allow(&host, a.ip()))
                .collect();
            if allowed.is_empty() {
                rejected.store(true, Ordering::SeqCst);
                return Err(format!("no allowed address for {host}").into());
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

/// A filter for untrusted URLs: refuses loopback, private, shared (CGNAT), link-local (which
/// holds the cloud metadata address 169.254.169.254), unspecified, multicast, broadcast and
/// documentation ranges, the other well-known metadata addresses, and IPv6 forms of all of these.
pub fn public_only(_host: &str, addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(a) => public_v4(a),
        IpAddr::V6(a) => {
            if let Some(v4) = a.to_ipv4_mapped() {
                return public_v4(v4);
            }
            let s = a.segments();
            !(a.is_loopback()
                || a.is_unspecified()
                || a.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local, incl. AWS fd00:ec2::254
                || (s[0] & 0xffc0) == 0xfe80 // link-local
                || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated, still routed internally)
                || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
                || (s[0] == 0x0064 && s[1] == 0xff9b) // NAT64 of any v4, private ones included
                || (s[0] == 0 && s[1] == 0 && s[2] == 0 && s[3] == 0 && s[4] == 0 && s[5] == 0))
            // v4-compatible
        }
    }
}

fn public_v4(a: std::net::Ipv4Addr) -> bool {
    let o = a.octets();
    !(a.is_loopback()
        || a.is_private()
        || a.is_link_local()
        || a.is_unspecified()
        || a.is_multicast()
        || a.is_broadcast()
        || a.is_documentation()
        || o[0] == 0
        || (o[0] == 100 && (o[1] & 0xc0) == 64) // shared address space (CGNAT)
        || (o[0] == 100 && o[1] == 100 && o[2] == 100 && o[3] == 200) // Alibaba Cloud metadata
        || (o[0] == 192 && o[1] == 0 && o[2] == 0) // IETF protocol assignments
        || (o[0] == 198 && (o[1] & 0xfe) == 18) // benchmarking
        || o[0] >= 240) // reserved
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_only_refuses_internal_addresses() {
        for a in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.100.100.200",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "fd00:ec2::254",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "fc00::1",
            "224.0.0.1",
            "255.255.255.255",
        ] {
            assert!(!public_only("h", a.parse().unwrap()), "{a} allowed");
        }
        for a in ["93.184.216.34", "8.8.8.8", "2606:4700::1111"] {
            assert!(public_only("h", a.parse().unwrap()), "{a} refused");
        }
    }

    #[test]
    fn only_http_urls_are_fetched() {
        assert!(http_url("https://example.com/a.png").is_some());
        for bad in [
            "ftp://x/y.png",
            "not a url",
            "file:///etc/passwd",
            "data:image/png;base64,AA",
            "http://",
        ] {
            assert!(http_url(bad).is_none(), "{bad}");
            assert_eq!(
                Fetcher::new().fetch(bad, "image[0]").unwrap_err().kind(),
                "Fetch",
                "{bad}"
            );
        }
    }
}
