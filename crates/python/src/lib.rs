//! Python binding (`deepring_recipe._native`): argument conversion and error mapping only.
//!
//! Every public class is declared with `module = "deepring_recipe._native"` so reprs and pickling
//! errors name the real module. Errors from the core crates become Python exceptions in
//! [`errors`], the one place that maps them.
//!
//! Module order (each module uses only modules before it): errors, json, enums, detach,
//! tokenizer, special_tokens, tool, image, resolver, message, conversation, encoding, options, response,
//! echo, stream, request; kernels (the engine's, private) stands apart.

use pyo3::prelude::*;

// Requests and streams allocate many small strings, maps and vectors; mimalloc serves them
// faster than glibc malloc (bench/recipe_render.py measures it).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod conversation;
mod detach;
mod echo;
mod encoding;
mod enums;
mod errors;
mod image;
mod json;
mod kernels;
mod message;
mod options;
mod request;
mod resolver;
mod response;
mod special_tokens;
mod stream;
mod tokenizer;
mod tool;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("IMAGE_SPECIAL_TOKEN_ID", 129_264)?;
    errors::register(m)?;
    enums::register(m)?;
    tokenizer::register(m)?;
    tool::register(m)?;
    image::register(m)?;
    resolver::register(m)?;
    message::register(m)?;
    conversation::register(m)?;
    special_tokens::register(m)?;
    encoding::register(m)?;
    enums::register_request_enums(m)?;
    options::register(m)?;
    request::register(m)?;
    request::register_responses(m)?;
    stream::register(m)?;
    response::register(m)?;
    kernels::register(m)?;
    Ok(())
}
