//! Declared Responses tools as conversion reads them: function tools, the built-in `apply_patch`
//! custom tool, and namespaces flattened into function tools.

use serde_json::{json, Value};

use super::wire::{ResponsesNamespaceTool, ResponsesRequest, ResponsesTool};
use crate::render::ModelVersion;
use crate::request::common::{self, bad, Result, ToolSpec};
use crate::request::options::{ConversionOptions, WebSearchBehavior};

/// The description deepseek-recipe gives the built-in `apply_patch` custom tool (the V4 text
/// has one blank line fewer).
const APPLY_PATCH_DESCRIPTION: &str = include_str!("apply_patch.txt");
const APPLY_PATCH_DESCRIPTION_V4: &str = include_str!("apply_patch_v4.txt");

fn apply_patch_parameters() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "properties": {
            "input": {
                "type": "string",
                "description": "The entire contents of the apply_patch command (the *** Begin Patch ... *** End Patch envelope)."
            }
        },
        "required": ["input"]
    })
}

impl ResponsesRequest {
    /// Declared tools as conversion reads them. With `all` false only what the namespace map
    /// needs is checked: names, and the members of namespaces (custom and web-search tools are
    /// neither checked nor listed).
    pub(super) fn tool_specs(
        &self,
        options: &ConversionOptions,
        version: ModelVersion,
        all: bool,
    ) -> Result<Vec<NamedSpec>> {
        let sep = namespace_separator(version);
        let mut out: Vec<NamedSpec> = Vec::new();
        for (i, tool) in self.tools.iter().flatten().enumerate() {
            match tool {
                ResponsesTool::Function(f) => {
                    common::check_tool_name(&f.name, &format!("tools[{i}].name"))?;
                    out.push(NamedSpec::plain(ToolSpec {
                        name: f.name.clone(),
                        description: f.description.clone(),
                        parameters: f.parameters.clone(),
                        strict: f.strict,
                        // Responses ignores `defer_loading` (only Messages honours it).
                        defer_loading: false,
                    }));
                }
                ResponsesTool::Custom { name, .. } if all => {
                    if name != "apply_patch" {
                        return Err(bad(format!(
                            "Unsupported custom tool: '{name}'. Only 'apply_patch' is supported."
                        )));
                    }
                    out.push(NamedSpec::plain(ToolSpec {
                        name: name.clone(),
                        description: Some(
                            match version {
                                ModelVersion::DeepseekV41Flash => APPLY_PATCH_DESCRIPTION,
                                ModelVersion::DeepseekV4Pro => APPLY_PATCH_DESCRIPTION_V4,
                            }
                            .to_string(),
                        ),
                        parameters: Some(apply_patch_parameters()),
                        strict: None,
                        defer_loading: false,
                    }));
                }
                ResponsesTool::Namespace {
                    name,
                    description,
                    tools,
                } => {
                    common::check_tool_name(name, &format!("tools[{i}].name"))?;
                    let mut members: Vec<&str> = Vec::new();
                    for (j, member) in tools.iter().enumerate() {
                        let f = match member {
                            ResponsesNamespaceTool::Custom { name: member } => {
                                return Err(bad(format!(
                                    "Currently custom tools are not allowed inside a namespace. Found custom tool '{member}' in tools[{i}].tools[{j}]."
                                )))
                            }
                            ResponsesNamespaceTool::Function(f) => f,
                        };
                        common::check_tool_name(&f.name, &format!("tools[{i}].tools[{j}].name"))?;
                        if members.contains(&f.name.as_str()) {
                            return Err(bad("Tool names within a namespace must be unique."));
                        }
                        members.push(&f.name);
                        // V4.1 prefixes the namespace description; V4-Pro keeps the member's.
                        let ns_description = description
                            .as_deref()
                            .filter(|d| !d.is_empty() && version == ModelVersion::DeepseekV41Flash);
                        let description = match ns_description {
                            Some(ns) => {
                                Some(format!("{ns}\n{}", f.description.as_deref().unwrap_or("")))
                            }
                            None => f.description.clone(),
                        };
                        // A flattened name taken by an earlier namespace gets a numeric suffix.
                        let base = format!("{name}{sep}{}", f.name);
                        let mut full = base.clone();
                        let mut k = 1;
                        while out.iter().any(|s| s.spec.name == full) {
                            full = format!("{base}_{k}");
                            k += 1;
                        }
                        out.push(NamedSpec {
                            spec: ToolSpec {
                                name: full,
                                description,
                                parameters: f.parameters.clone(),
                                strict: f.strict,
                                defer_loading: false,
                            },
                            namespace: Some((name.clone(), f.name.clone())),
                        });
                    }
                }
                ResponsesTool::WebSearch(_) | ResponsesTool::WebSearch20250826(_)
                    if all && options.responses_web_search == WebSearchBehavior::Reject =>
                {
                    return Err(bad("Server tools are not supported"));
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// `(function name, namespace, local name)` of every declared namespace tool.
    pub fn namespace_tool_map(
        &self,
        options: &ConversionOptions,
    ) -> Result<Vec<(String, String, String)>> {
        let version = common::resolve_model(options, &self.model)?;
        Ok(self
            .tool_specs(options, version, false)?
            .into_iter()
            .filter_map(|s| s.namespace.map(|(ns, local)| (s.spec.name, ns, local)))
            .collect())
    }
}

/// How a namespace and a member name are joined into a function name: V4-Pro tool names cannot
/// hold `::`.
fn namespace_separator(version: ModelVersion) -> &'static str {
    match version {
        ModelVersion::DeepseekV41Flash => "::",
        ModelVersion::DeepseekV4Pro => "__",
    }
}

/// A declared tool and, for a namespace member, its namespace and local name.
pub(super) struct NamedSpec {
    pub(super) spec: ToolSpec,
    namespace: Option<(String, String)>,
}

impl NamedSpec {
    fn plain(spec: ToolSpec) -> Self {
        NamedSpec {
            spec,
            namespace: None,
        }
    }
}
