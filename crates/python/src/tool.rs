//! ToolCall and ToolDefinition: value classes wrapping the core types.

use deepring_recipe::{ToolCall, ToolDefinition};
use pyo3::prelude::*;
use serde_json::Value;

use crate::json::{quoted, to_json, to_py};

#[pyclass(module = "deepring_recipe._native", name = "ToolCall", frozen)]
#[derive(Clone)]
pub(crate) struct PyToolCall {
    pub(crate) inner: ToolCall,
}

#[pymethods]
impl PyToolCall {
    #[new]
    fn new(id: String, name: String, arguments: String) -> Self {
        PyToolCall {
            inner: ToolCall {
                id,
                name,
                arguments,
            },
        }
    }
    #[getter]
    fn id(&self) -> &str {
        &self.inner.id
    }
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }
    #[getter]
    fn arguments(&self) -> &str {
        &self.inner.arguments
    }
    fn __repr__(&self) -> String {
        format!(
            "ToolCall(id={}, name={}, arguments={})",
            quoted(&self.inner.id),
            quoted(&self.inner.name),
            quoted(&self.inner.arguments)
        )
    }
}

#[pyclass(module = "deepring_recipe._native", name = "ToolDefinition", frozen)]
#[derive(Clone)]
pub(crate) struct PyToolDefinition {
    pub(crate) inner: ToolDefinition,
}

#[pymethods]
impl PyToolDefinition {
    #[new]
    #[pyo3(signature = (name, description = None, parameters = None, strict = None, defer_loading = false))]
    fn new(
        name: String,
        description: Option<String>,
        parameters: Option<&Bound<'_, PyAny>>,
        strict: Option<bool>,
        defer_loading: bool,
    ) -> PyResult<Self> {
        let parameters = match parameters {
            Some(p) => to_json(p)?,
            None => Value::Null,
        };
        Ok(PyToolDefinition {
            inner: ToolDefinition {
                name,
                description,
                parameters,
                strict,
                defer_loading,
            },
        })
    }
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }
    #[getter]
    fn description(&self) -> Option<&str> {
        self.inner.description.as_deref()
    }
    #[getter]
    fn parameters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &self.inner.parameters)
    }
    #[getter]
    fn strict(&self) -> Option<bool> {
        self.inner.strict
    }
    #[getter]
    fn defer_loading(&self) -> bool {
        self.inner.defer_loading
    }
    fn __repr__(&self) -> String {
        format!(
            "ToolDefinition(name={}, description={}, strict={})",
            quoted(&self.inner.name),
            self.inner
                .description
                .as_deref()
                .map_or("None".into(), quoted),
            match self.inner.strict {
                Some(true) => "True",
                Some(false) => "False",
                None => "None",
            }
        )
    }
}

pub(crate) fn tools_from_py(
    tools: Option<Vec<PyRef<'_, PyToolDefinition>>>,
) -> Vec<ToolDefinition> {
    tools
        .map(|t| t.iter().map(|t| t.inner.clone()).collect())
        .unwrap_or_default()
}

pub(crate) fn tools_to_py(
    py: Python<'_>,
    tools: &[ToolDefinition],
) -> PyResult<Vec<Py<PyToolDefinition>>> {
    tools
        .iter()
        .map(|t| Py::new(py, PyToolDefinition { inner: t.clone() }))
        .collect()
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyToolCall>()?;
    m.add_class::<PyToolDefinition>()?;
    Ok(())
}
