//! Python enums mirroring the core enums (pyo3 simple enums: `Kind.Variant`, comparable).

use deepring_recipe::{ModelVersion, SpecialToken};
use pyo3::prelude::*;

macro_rules! mirror_enum {
    ($py:ident, $name:literal, $core:ty { $($v:ident => $c:expr),+ $(,)? }) => {
        #[pyclass(eq, eq_int, frozen, from_py_object, module = "deepring_recipe._native", name = $name)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(crate) enum $py { $($v),+ }

        impl From<$py> for $core {
            fn from(v: $py) -> Self {
                match v { $($py::$v => $c),+ }
            }
        }

        impl From<$core> for $py {
            fn from(v: $core) -> Self {
                $(if v == $c { return $py::$v; })+
                unreachable!("every variant is listed")
            }
        }
    };
}

mirror_enum!(PySpecialToken, "SpecialToken", SpecialToken {
    Bos => SpecialToken::Bos,
    Eos => SpecialToken::Eos,
    ThinkingStart => SpecialToken::ThinkingStart,
    ThinkingEnd => SpecialToken::ThinkingEnd,
    System => SpecialToken::System,
    User => SpecialToken::User,
    Assistant => SpecialToken::Assistant,
    LatestReminder => SpecialToken::LatestReminder,
    Dsml => SpecialToken::Dsml,
    Image => SpecialToken::Image,
    Ref => SpecialToken::Ref,
    RefEnd => SpecialToken::RefEnd,
    Box => SpecialToken::Box,
    BoxEnd => SpecialToken::BoxEnd,
    Point => SpecialToken::Point,
    PointEnd => SpecialToken::PointEnd,
    Polygon => SpecialToken::Polygon,
    PolygonEnd => SpecialToken::PolygonEnd,
});

#[pymethods]
impl PySpecialToken {
    fn default_str(&self) -> &'static str {
        SpecialToken::from(*self).default_str()
    }
}

mirror_enum!(PyModelVersion, "ModelVersion", ModelVersion {
    DeepseekV4Pro => ModelVersion::DeepseekV4Pro,
    DeepseekV41Flash => ModelVersion::DeepseekV41Flash,
});

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySpecialToken>()?;
    m.add_class::<PyModelVersion>()?;
    Ok(())
}

use deepring_recipe::request::{ReasoningContentBehavior, ThinkingInitialStage, WebSearchBehavior};

mirror_enum!(PyThinkingInitialStage, "ThinkingInitialStage", ThinkingInitialStage {
    ReasoningStart => ThinkingInitialStage::ReasoningStart,
    ReasoningContinuation => ThinkingInitialStage::ReasoningContinuation,
    ContentContinuation => ThinkingInitialStage::ContentContinuation,
});

#[pymethods]
impl PyThinkingInitialStage {
    fn starts_in_reasoning(&self) -> bool {
        ThinkingInitialStage::from(*self).starts_in_reasoning()
    }
}

mirror_enum!(PyReasoningContentBehavior, "ReasoningContentBehavior", ReasoningContentBehavior {
    FillEmpty => ReasoningContentBehavior::FillEmpty,
    Reject => ReasoningContentBehavior::Reject,
});

mirror_enum!(PyWebSearchBehavior, "WebSearchBehavior", WebSearchBehavior {
    Drop => WebSearchBehavior::Drop,
    Reject => WebSearchBehavior::Reject,
});

pub(crate) fn register_request_enums(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyThinkingInitialStage>()?;
    m.add_class::<PyReasoningContentBehavior>()?;
    m.add_class::<PyWebSearchBehavior>()?;
    Ok(())
}
