//! Python objects <-> `serde_json::Value`, with deepseek-recipe's guards: at most 128 nested
//! containers, no cycles, string keys, finite numbers, integers within the JSON number range.

use pyo3::exceptions::{PyOverflowError, PyRecursionError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

pub(crate) const MAX_DEPTH: usize = 128;

/// Convert a Python object to JSON.
pub(crate) fn to_json(obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    let mut path = Vec::new();
    convert(obj, &mut path)
}

fn convert(obj: &Bound<'_, PyAny>, path: &mut Vec<usize>) -> PyResult<Value> {
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::String(s.to_str()?.to_owned()));
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if obj.is_instance_of::<PyInt>() {
        if let Ok(i) = obj.extract::<i64>() {
            return Ok(Value::from(i));
        }
        if let Ok(u) = obj.extract::<u64>() {
            return Ok(Value::from(u));
        }
        return Err(PyOverflowError::new_err(
            "integer is outside the JSON number range",
        ));
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        let v = f.value();
        return Number::from_f64(v).map(Value::Number).ok_or_else(|| {
            let spelled = if v.is_nan() {
                "NaN".to_string()
            } else if v > 0.0 {
                "inf".to_string()
            } else {
                "-inf".to_string()
            };
            PyValueError::new_err(format!("{spelled} is not a finite JSON number"))
        });
    }
    let is_dict = obj.is_instance_of::<PyDict>();
    let is_seq = obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>();
    if !is_dict && !is_seq {
        let name = obj.get_type().name()?;
        return Err(PyTypeError::new_err(format!("{name} is not a JSON value")));
    }
    let id = obj.as_ptr() as usize;
    if path.contains(&id) {
        return Err(PyValueError::new_err("circular reference in JSON input"));
    }
    if path.len() >= MAX_DEPTH {
        return Err(PyRecursionError::new_err(format!(
            "JSON input exceeds the maximum nesting depth of {MAX_DEPTH}"
        )));
    }
    path.push(id);
    let result = if is_dict {
        let dict = obj.cast::<PyDict>()?;
        let mut map = Map::with_capacity(dict.len());
        for (k, v) in dict.iter() {
            let Ok(key) = k.cast::<PyString>() else {
                path.pop();
                return Err(PyTypeError::new_err("JSON object keys must be str"));
            };
            let key = key.to_str()?.to_owned();
            let value = convert(&v, path)?;
            map.insert(key, value);
        }
        Value::Object(map)
    } else {
        let mut items = Vec::new();
        for item in obj.try_iter()? {
            items.push(convert(&item?, path)?);
        }
        Value::Array(items)
    };
    path.pop();
    Ok(result)
}

/// Convert JSON to Python objects (dict, list, str, int, float, bool, None).
pub(crate) fn to_py<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else {
                PyFloat::new(py, n.as_f64().unwrap_or(f64::NAN)).into_any()
            }
        }
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_py(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, v) in map {
                dict.set_item(k, to_py(py, v)?)?;
            }
            dict.into_any()
        }
    })
}

/// Byte offsets into `text` (ascending) -> Python code-point offsets, in one pass.
pub(crate) fn byte_ranges_to_chars(text: &str, ranges: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(ranges.len());
    let mut byte = 0usize;
    let mut chars = 0usize;
    let mut advance = |to: usize| -> usize {
        if to > byte {
            chars += text.get(byte..to).map_or(0, |s| s.chars().count());
            byte = to;
        }
        chars
    };
    for &(s, e) in ranges {
        let cs = advance(s);
        let ce = advance(e);
        out.push((cs, ce));
    }
    out
}

/// A string as the reprs show it: a JSON string literal.
pub(crate) fn quoted(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}
