//! The fetcher's guards, against a server on 127.0.0.1 that this test starts: the time limit
//! (a server that stalls), the byte limit, and the public-address filter, which must refuse
//! internal destinations before any connection is made (no traffic leaves this machine: every
//! refused address is refused by the filter, not by a failed connect).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use deepring_image::fetch::{public_only, Fetcher};

/// Serves each of `n` connections with `respond(request_line)`; returns the base URL.
fn serve(n: usize, respond: impl Fn(&str) -> Option<Vec<u8>> + Send + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    thread::spawn(move || {
        for stream in listener.incoming().take(n) {
            let Ok(mut stream) = stream else { continue };
            let mut buf = [0u8; 4096];
            let len = stream.read(&mut buf).unwrap_or(0);
            let request = String::from_utf8_lossy(&buf[..len]).to_string();
            match respond(request.lines().next().unwrap_or("")) {
                Some(reply) => {
                    let _ = stream.write_all(&reply);
                }
                // Stall: hold the connection open past the client's limit, then drop it.
                None => thread::sleep(Duration::from_secs(3)),
            }
        }
    });
    base
}

fn ok(body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

#[test]
fn a_stalled_server_times_out() {
    let base = serve(1, |_| None);
    let fetcher = Fetcher::new().with_timeout(Duration::from_millis(500));
    let start = Instant::now();
    let err = fetcher
        .fetch(&format!("{base}/slow"), "image[0]")
        .unwrap_err();
    assert_eq!(err.kind(), "Fetch");
    assert!(err.is_retryable());
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn bodies_over_the_limit_are_refused() {
    let base = serve(2, |_| Some(ok(&[0u8; 5000])));
    let err = Fetcher::with_max_bytes(1000)
        .fetch(&format!("{base}/big"), "image[0]")
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "image[0]: image file size exceeds limit 0 MB"
    );
    assert_eq!(
        Fetcher::with_max_bytes(5000)
            .fetch(&format!("{base}/big"), "image[0]")
            .unwrap()
            .len(),
        5000
    );
}

#[test]
fn public_only_refuses_internal_destinations_before_connecting() {
    let fetcher = Fetcher::new().with_destination_filter(Arc::new(public_only));
    for url in [
        "http://127.0.0.1:9/a.png",
        "http://localhost:9/a.png",
        "http://[::1]:9/a.png",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/a.png",
        "http://192.168.0.1/a.png",
        "http://[fe80::1]/a.png",
        "http://[::ffff:127.0.0.1]:9/a.png",
    ] {
        let err = fetcher.fetch(url, "image[0]").unwrap_err();
        assert_eq!(err.kind(), "DestinationRejected", "{url}");
        assert!(!err.is_retryable());
    }
}

#[test]
fn redirects_to_refused_destinations_are_refused() {
    // The filter admits the literal address the server listens on, and nothing else.
    let base = serve(1, |_| {
        Some(
            b"HTTP/1.1 302 Found\r\nLocation: http://localhost:9/x\r\nContent-Length: 0\r\n\r\n"
                .to_vec(),
        )
    });
    let only_literal = |host: &str, _addr: std::net::IpAddr| host == "127.0.0.1";
    let fetcher = Fetcher::new().with_destination_filter(Arc::new(only_literal));
    let err = fetcher.fetch(&format!("{base}/r"), "image[0]").unwrap_err();
    assert_eq!(err.kind(), "DestinationRejected");
}
