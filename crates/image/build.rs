//! Compiles csrc/webp_wavefront.c: libwebp's lossy encoder with its main pass on two threads.
//! It includes libwebp's private headers and two of its sources (libwebp/, copied unmodified
//! from the libwebp-sys release pinned in Cargo.toml) and links against that crate's library,
//! so it is built with the defines libwebp-sys builds libwebp with: the private structures it
//! shares with the library must have the same layout.

fn main() {
    println!("cargo:rerun-if-changed=csrc");
    println!("cargo:rerun-if-changed=libwebp");
    let mut build = cc::Build::new();
    build
        .file("csrc/webp_wavefront.c")
        .include("libwebp")
        .define("NDEBUG", Some("1"))
        .define("_THREAD_SAFE", Some("1"))
        // libwebp-sys's `std` feature, which the workspace turns on.
        .define("WEBP_USE_THREAD", Some("1"));
    if !build.get_compiler().is_like_msvc() {
        build.flag("-fvisibility=hidden");
    }
    build.compile("deepring_webp");
}
