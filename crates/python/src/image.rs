//! ImageSource and its subclasses (data URL, URL, bytes): value classes wrapping the core type;
//! a source returned to Python is built with its subclass.

use deepring_recipe::{ImageData, ImageDetail, ImageSource};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use pyo3::PyClassInitializer;

use crate::json::quoted;

#[pyclass(
    module = "deepring_recipe._native",
    name = "ImageSource",
    subclass,
    frozen
)]
#[derive(Clone)]
pub(crate) struct PyImageSource {
    pub(crate) inner: ImageSource,
}

pub(crate) fn parse_detail(detail: &str) -> PyResult<ImageDetail> {
    ImageDetail::parse(detail).ok_or_else(|| {
        PyValueError::new_err(format!(
            "invalid detail \"{detail}\"; expected \"low\", \"high\", \"original\", or \"auto\""
        ))
    })
}

#[pymethods]
impl PyImageSource {
    #[getter]
    fn kind(&self) -> &'static str {
        match self.inner.data {
            ImageData::DataUrl(_) => "data_url",
            ImageData::Url(_) => "url",
            ImageData::Bytes(_) => "bytes",
        }
    }
    #[getter]
    fn detail(&self) -> &'static str {
        self.inner.detail.as_str()
    }
    #[getter]
    fn data_url(&self) -> Option<&str> {
        match &self.inner.data {
            ImageData::DataUrl(u) => Some(u),
            _ => None,
        }
    }
    #[getter]
    fn url(&self) -> Option<&str> {
        match &self.inner.data {
            ImageData::Url(u) => Some(u),
            _ => None,
        }
    }
    #[getter]
    fn data<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        match &self.inner.data {
            ImageData::Bytes(b) => Some(PyBytes::new(py, b)),
            _ => None,
        }
    }
    #[getter]
    fn path(&self) -> &str {
        &self.inner.path
    }
    fn __repr__(&self) -> String {
        let (class, value) = match &self.inner.data {
            ImageData::DataUrl(u) => ("DataUrlImageSource", quoted(u)),
            ImageData::Url(u) => ("UrlImageSource", quoted(u)),
            ImageData::Bytes(b) => ("BytesImageSource", format!("<{} bytes>", b.len())),
        };
        format!(
            "{class}({value}, detail={}, path={})",
            quoted(self.inner.detail.as_str()),
            quoted(&self.inner.path)
        )
    }
}

#[pyclass(module = "deepring_recipe._native", name = "DataUrlImageSource", extends = PyImageSource, frozen)]
pub(crate) struct PyDataUrlImageSource;

#[pymethods]
impl PyDataUrlImageSource {
    #[new]
    #[pyo3(signature = (data_url, detail = "high", *, path = String::new()))]
    fn new(data_url: String, detail: &str, path: String) -> PyResult<PyClassInitializer<Self>> {
        let inner = ImageSource {
            data: ImageData::DataUrl(data_url),
            detail: parse_detail(detail)?,
            path,
        };
        Ok(PyClassInitializer::from(PyImageSource { inner }).add_subclass(PyDataUrlImageSource))
    }
}

#[pyclass(module = "deepring_recipe._native", name = "UrlImageSource", extends = PyImageSource, frozen)]
pub(crate) struct PyUrlImageSource;

#[pymethods]
impl PyUrlImageSource {
    #[new]
    #[pyo3(signature = (url, detail = "high", *, path = String::new()))]
    fn new(url: String, detail: &str, path: String) -> PyResult<PyClassInitializer<Self>> {
        let inner = ImageSource {
            data: ImageData::Url(url),
            detail: parse_detail(detail)?,
            path,
        };
        Ok(PyClassInitializer::from(PyImageSource { inner }).add_subclass(PyUrlImageSource))
    }
}

#[pyclass(module = "deepring_recipe._native", name = "BytesImageSource", extends = PyImageSource, frozen)]
pub(crate) struct PyBytesImageSource;

#[pymethods]
impl PyBytesImageSource {
    #[new]
    #[pyo3(signature = (data, detail = "high", *, path = String::new()))]
    fn new(data: Vec<u8>, detail: &str, path: String) -> PyResult<PyClassInitializer<Self>> {
        let inner = ImageSource {
            data: ImageData::Bytes(data),
            detail: parse_detail(detail)?,
            path,
        };
        Ok(PyClassInitializer::from(PyImageSource { inner }).add_subclass(PyBytesImageSource))
    }
}

pub(crate) fn image_to_py(py: Python<'_>, source: &ImageSource) -> PyResult<Py<PyAny>> {
    let base = PyImageSource {
        inner: source.clone(),
    };
    let init = PyClassInitializer::from(base);
    Ok(match source.data {
        ImageData::DataUrl(_) => {
            Bound::new(py, init.add_subclass(PyDataUrlImageSource))?.into_any()
        }
        ImageData::Url(_) => Bound::new(py, init.add_subclass(PyUrlImageSource))?.into_any(),
        ImageData::Bytes(_) => Bound::new(py, init.add_subclass(PyBytesImageSource))?.into_any(),
    }
    .unbind())
}

pub(crate) fn images_from_py(images: Option<Vec<PyRef<'_, PyImageSource>>>) -> Vec<ImageSource> {
    images
        .map(|v| v.iter().map(|i| i.inner.clone()).collect())
        .unwrap_or_default()
}

/// The RGB pixels of an image (PNG, JPEG, WebP, GIF's first frame): `(width, height, bytes)`,
/// rows of `width * 3` bytes. Not part of the official API: the engine decodes the WebP the
/// preprocessor made into what the vision tower reads. ValueError for bytes it cannot decode.
#[pyfunction]
fn decode_rgb(py: Python<'_>, data: Vec<u8>) -> PyResult<(u32, u32, Py<PyBytes>)> {
    // 2^16 px a side: far past any canvas the preprocessor makes (WebP's own cap is 16383).
    let rgb = py
        .detach(|| deepring_image::codec::decode(&data, 1 << 16))
        .map_err(|e| PyValueError::new_err(format!("cannot decode the image: {e:?}")))?;
    Ok((
        rgb.width,
        rgb.height,
        PyBytes::new(py, &rgb.pixels).unbind(),
    ))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(decode_rgb, m)?)?;
    m.add_class::<PyImageSource>()?;
    m.add_class::<PyDataUrlImageSource>()?;
    m.add_class::<PyUrlImageSource>()?;
    m.add_class::<PyBytesImageSource>()?;
    Ok(())
}
