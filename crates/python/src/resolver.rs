//! The image half of the API: `ImageInfo`, `MultiModalData`, `ImageQuota`, `PreprocessOptions`,
//! `ReqwestImageFetcher`, `OpenCvImagePreprocessor`, `ImageResolver`, and their two exceptions.
//! Decoding, resampling, encoding and fetching run with the GIL released.

use std::net::IpAddr;
use std::sync::Arc;

use deepring_image::{self as img, DestinationFilter, Fetcher};
use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes};

use crate::image::{parse_detail, PyImageSource};

pyo3::create_exception!(
    deepring_recipe._native,
    ImageError,
    PyException,
    "A failure to resolve, fetch, or preprocess images, including request limits."
);
pyo3::create_exception!(
    deepring_recipe._native,
    CalcResizeError,
    PyValueError,
    "The Rust image token calculation did not converge."
);

/// `ImageError` with the official's `kind` and `is_retryable` attributes.
fn image_error(e: img::ImageError) -> PyErr {
    Python::attach(|py| {
        let err = ImageError::new_err(e.to_string());
        let value = err.value(py);
        match value
            .setattr("kind", e.kind())
            .and_then(|_| value.setattr("is_retryable", e.is_retryable()))
        {
            Ok(()) => err,
            Err(set_err) => set_err,
        }
    })
}

/// A preprocessed image for the inference backend: the encoded WebP bytes and the canvas width
/// and height in pixels.
#[pyclass(module = "deepring_recipe._native", name = "ImageInfo", frozen)]
#[derive(Clone)]
pub(crate) struct PyImageInfo {
    inner: img::ImageInfo,
}

#[pymethods]
impl PyImageInfo {
    #[new]
    fn new(data: Vec<u8>, width: u32, height: u32) -> Self {
        PyImageInfo {
            inner: img::ImageInfo {
                data,
                width,
                height,
            },
        }
    }
    #[getter]
    fn data<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.data)
    }
    #[getter]
    fn width(&self) -> u32 {
        self.inner.width
    }
    #[getter]
    fn height(&self) -> u32 {
        self.inner.height
    }
}

/// Images in the order their placeholders appear in a prompt.
#[pyclass(module = "deepring_recipe._native", name = "MultiModalData", frozen)]
pub(crate) struct PyMultiModalData {
    images: Vec<img::ImageInfo>,
}

#[pymethods]
impl PyMultiModalData {
    #[new]
    #[pyo3(signature = (images = None))]
    fn new(images: Option<Vec<PyRef<'_, PyImageInfo>>>) -> Self {
        let images = images
            .unwrap_or_default()
            .iter()
            .map(|i| i.inner.clone())
            .collect();
        PyMultiModalData { images }
    }
    #[getter]
    fn images(&self) -> Vec<PyImageInfo> {
        self.images
            .iter()
            .map(|i| PyImageInfo { inner: i.clone() })
            .collect()
    }
    fn is_empty(&self) -> bool {
        self.images.is_empty()
    }
    /// Return the number of inference input tokens beyond one per placeholder.
    ///
    /// Each image occupies one placeholder in the prompt but costs its V4.1 image token count;
    /// the adjustment is the sum of the differences. Raises `CalcResizeError` when fitting an
    /// image to the token budget does not converge.
    fn image_token_adjustment(&self) -> PyResult<u64> {
        img::token_adjustment(self.images.iter().map(|i| (i.width, i.height)))
            .map_err(|e| CalcResizeError::new_err(e.to_string()))
    }
}

/// The image count and encoded bytes recorded by the completed resolve calls of one request.
///
/// Pass the same quota to every resolve call of a request so that the per-request limits apply
/// across them. A call records its sources only once every one of them is preprocessed, so a
/// failed call adds nothing.
#[pyclass(module = "deepring_recipe._native", name = "ImageQuota")]
pub(crate) struct PyImageQuota {
    inner: img::ImageQuota,
}

#[pymethods]
impl PyImageQuota {
    #[new]
    fn new() -> Self {
        PyImageQuota {
            inner: img::ImageQuota::new(),
        }
    }
    fn image_count(&self) -> usize {
        self.inner.image_count()
    }
    fn byte_size(&self) -> usize {
        self.inner.byte_size()
    }
}

/// Options of one preprocessing call.
#[pyclass(module = "deepring_recipe._native", name = "PreprocessOptions", frozen)]
pub(crate) struct PyPreprocessOptions {
    inner: img::PreprocessOptions,
}

#[pymethods]
impl PyPreprocessOptions {
    #[new]
    fn new(
        detail: &str,
        max_dimension_px: u32,
        low_detail_max_dimension_px: u32,
    ) -> PyResult<Self> {
        let detail = parse_detail(detail)?;
        Ok(PyPreprocessOptions {
            inner: img::PreprocessOptions {
                detail,
                max_dimension_px,
                low_detail_max_dimension_px,
            },
        })
    }
    #[getter]
    fn detail(&self) -> &'static str {
        self.inner.detail.as_str()
    }
    #[getter]
    fn max_dimension_px(&self) -> u32 {
        self.inner.max_dimension_px
    }
    #[getter]
    fn low_detail_max_dimension_px(&self) -> u32 {
        self.inner.low_detail_max_dimension_px
    }
}

/// A Python callable as a destination filter: only a `True` result allows the address; an
/// exception or any other value refuses it.
struct PyFilter(Py<PyAny>);

impl DestinationFilter for PyFilter {
    fn allow(&self, host: &str, addr: IpAddr) -> bool {
        Python::attach(|py| match self.0.call1(py, (host, addr.to_string())) {
            Ok(v) => match v.bind(py).cast::<PyBool>() {
                Ok(b) => b.is_true(),
                Err(_) => {
                    // As the official: the refusal is reported as an unraisable exception.
                    let err = PyTypeError::new_err(format!(
                        "'{}' object cannot be cast as 'bool'",
                        v.bind(py)
                            .get_type()
                            .name()
                            .map(|n| n.to_string())
                            .unwrap_or_default()
                    ));
                    err.write_unraisable(py, Some(self.0.bind(py)));
                    false
                }
            },
            Err(err) => {
                err.write_unraisable(py, Some(self.0.bind(py)));
                false
            }
        })
    }
}

/// Downloads image URLs over HTTP(S).
///
/// Without a destination filter it connects to any address; when untrusted clients supply image
/// URLs, install one with `with_destination_filter` (SSRF).
#[pyclass(
    module = "deepring_recipe._native",
    name = "ReqwestImageFetcher",
    frozen
)]
#[derive(Clone)]
pub(crate) struct PyFetcher {
    inner: Fetcher,
}

#[pymethods]
impl PyFetcher {
    #[new]
    fn new() -> Self {
        PyFetcher {
            inner: Fetcher::new(),
        }
    }
    #[staticmethod]
    fn with_max_bytes(max_bytes: usize) -> Self {
        PyFetcher {
            inner: Fetcher::with_max_bytes(max_bytes),
        }
    }
    /// Return a fetcher with this size limit that connects only to allowed addresses.
    ///
    /// `destination_filter(host, address)` receives the host of the image URL or of a redirect
    /// target and one resolved address as a string (`"10.0.0.1"`), and returns whether the
    /// fetcher may connect to it. For a host name, only the allowed addresses are connected to;
    /// a host with none raises `ImageError` with kind `"DestinationRejected"`, as does a callable
    /// that raises or returns a non-boolean. The returned fetcher uses no proxy. Raises
    /// `TypeError` when `destination_filter` is not callable.
    fn with_destination_filter(&self, destination_filter: Bound<'_, PyAny>) -> PyResult<Self> {
        if !destination_filter.is_callable() {
            return Err(PyTypeError::new_err("destination_filter must be callable"));
        }
        let filter: Arc<dyn DestinationFilter> = Arc::new(PyFilter(destination_filter.unbind()));
        Ok(PyFetcher {
            inner: self.inner.with_destination_filter(filter),
        })
    }
    fn fetch<'py>(&self, py: Python<'py>, url: &str) -> PyResult<Bound<'py, PyBytes>> {
        let fetcher = self.inner.clone();
        let data = py
            .detach(|| fetcher.fetch(url, "image[0]"))
            .map_err(image_error)?;
        Ok(PyBytes::new(py, &data))
    }
}

/// Decodes, fits, resamples and encodes one image (named for the official's OpenCV
/// implementation; this one uses the Rust `image`, `fast_image_resize` and libwebp).
#[pyclass(
    module = "deepring_recipe._native",
    name = "OpenCvImagePreprocessor",
    frozen
)]
pub(crate) struct PyPreprocessor;

#[pymethods]
impl PyPreprocessor {
    #[new]
    fn new() -> Self {
        PyPreprocessor
    }
    fn preprocess(
        &self,
        py: Python<'_>,
        data: Vec<u8>,
        options: &PyPreprocessOptions,
    ) -> PyResult<PyImageInfo> {
        let options = options.inner;
        py.detach(|| img::preprocess(&data, options, "image[0]"))
            .map(|inner| PyImageInfo { inner })
            .map_err(image_error)
    }
}

/// Resolves image sources with an explicit fetcher and preprocessor.
#[pyclass(module = "deepring_recipe._native", name = "ImageResolver", frozen)]
pub(crate) struct PyImageResolver {
    fetcher: Fetcher,
}

#[pymethods]
impl PyImageResolver {
    #[new]
    fn new(fetcher: PyRef<'_, PyFetcher>, preprocessor: PyRef<'_, PyPreprocessor>) -> Self {
        let _ = preprocessor;
        PyImageResolver {
            fetcher: fetcher.inner.clone(),
        }
    }
    /// Resolve image sources and update the quota; a failed call leaves it unchanged.
    fn resolve(
        &self,
        py: Python<'_>,
        sources: Vec<PyRef<'_, PyImageSource>>,
        mut quota: PyRefMut<'_, PyImageQuota>,
    ) -> PyResult<PyMultiModalData> {
        let sources: Vec<_> = sources.iter().map(|s| s.inner.clone()).collect();
        let mut q = quota.inner;
        let fetcher = &self.fetcher;
        let images = py
            .detach(|| img::resolve(&sources, &mut q, Some(fetcher)))
            .map_err(image_error)?;
        quota.inner = q;
        Ok(PyMultiModalData { images })
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let class = py.get_type::<ImageError>();
    // Class-level defaults so the attributes exist on the type as the stub declares them.
    class.setattr("kind", "")?;
    class.setattr("is_retryable", false)?;
    m.add("ImageError", class)?;
    m.add("CalcResizeError", py.get_type::<CalcResizeError>())?;
    m.add_class::<PyImageInfo>()?;
    m.add_class::<PyMultiModalData>()?;
    m.add_class::<PyImageQuota>()?;
    m.add_class::<PyPreprocessOptions>()?;
    m.add_class::<PyFetcher>()?;
    m.add_class::<PyPreprocessor>()?;
    m.add_class::<PyImageResolver>()?;
    Ok(())
}
