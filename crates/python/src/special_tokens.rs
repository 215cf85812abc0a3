//! SpecialTokens: the special-token spellings an encoding renders with and conversion options
//! use.

use deepring_recipe::{SpecialToken, SpecialTokens};
use pyo3::prelude::*;

use crate::enums::PySpecialToken;

#[pyclass(module = "deepring_recipe._native", name = "SpecialTokens", frozen)]
#[derive(Clone)]
pub(crate) struct PySpecialTokens {
    pub(crate) inner: SpecialTokens,
}

#[pymethods]
impl PySpecialTokens {
    #[new]
    #[pyo3(signature = (
        *, bos = None, eos = None, thinking_start = None, thinking_end = None, system = None,
        user = None, assistant = None, latest_reminder = None, dsml = None, image = None,
        r#ref = None, ref_end = None, r#box = None, box_end = None, point = None, point_end = None,
        polygon = None, polygon_end = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        bos: Option<String>,
        eos: Option<String>,
        thinking_start: Option<String>,
        thinking_end: Option<String>,
        system: Option<String>,
        user: Option<String>,
        assistant: Option<String>,
        latest_reminder: Option<String>,
        dsml: Option<String>,
        image: Option<String>,
        r#ref: Option<String>,
        ref_end: Option<String>,
        r#box: Option<String>,
        box_end: Option<String>,
        point: Option<String>,
        point_end: Option<String>,
        polygon: Option<String>,
        polygon_end: Option<String>,
    ) -> Self {
        use SpecialToken as T;
        let overrides = [
            (T::Bos, bos),
            (T::Eos, eos),
            (T::ThinkingStart, thinking_start),
            (T::ThinkingEnd, thinking_end),
            (T::System, system),
            (T::User, user),
            (T::Assistant, assistant),
            (T::LatestReminder, latest_reminder),
            (T::Dsml, dsml),
            (T::Image, image),
            (T::Ref, r#ref),
            (T::RefEnd, ref_end),
            (T::Box, r#box),
            (T::BoxEnd, box_end),
            (T::Point, point),
            (T::PointEnd, point_end),
            (T::Polygon, polygon),
            (T::PolygonEnd, polygon_end),
        ];
        let mut inner = SpecialTokens::default();
        for (token, spelling) in overrides {
            if let Some(s) = spelling {
                inner = inner.with(token, s);
            }
        }
        PySpecialTokens { inner }
    }

    fn token(&self, token: PySpecialToken) -> String {
        self.inner.token(token.into()).to_string()
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySpecialTokens>()?;
    Ok(())
}
