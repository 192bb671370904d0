//! The features file, `python -m memtrace_trainer features --json`: the one parser. Every
//! estimator that reads a job's features (analytic, Horus, the model-state formulas, ML) reads
//! them from here, and what the file holds that nothing reads, or holds in a shape that cannot
//! be used, is said (a warning) or refused (an error naming the file and the field).

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{EstimateError, Result};
use crate::features::{Features, Layer};

/// The fields `features --json` writes (`activation_encoding` only in files of earlier
/// versions, which memest never read: it derives the ML estimator's encoding itself). Any other
/// is warned about: a misspelt field is otherwise read as absent.
pub const FIELDS: [&str; 13] = [
    "model",
    "total_parameters",
    "total_activations",
    "batch_size",
    "seq_len",
    "input_shape",
    "depth",
    "layer_counts",
    "activation_function",
    "activation_encoding",
    "layers",
    "sequence",
    "gpumemnet_sequence",
];

/// A parsed features file: the features every feature-based estimator reads, what only the ML
/// estimator reads, and what could not be used.
#[derive(Debug, Clone, PartialEq)]
pub struct FeaturesFile {
    /// Parameters, activations, batch, input sizes and layers.
    pub features: Features,
    /// `depth`: the trainer's count of layers with parameters (the ML estimator's depth when
    /// there is no `gpumemnet_sequence`), when given.
    pub depth: Option<u64>,
    /// `activation_function`: the model's activation; `None` when absent or null.
    pub activation_function: Option<String>,
    /// `gpumemnet_sequence`: the layers in GPUMemNet's spelling (lower-case torchsummary types);
    /// empty when absent or empty (the ML estimator then reads [`Features::layers`]).
    pub gpumemnet_layers: Vec<Layer>,
    /// What was ignored or only partly used, each naming the file and the field.
    pub warnings: Vec<String>,
}

/// The field's error: the file, the field and what was expected.
fn field(path: &Path, field: &str, expected: &str) -> EstimateError {
    EstimateError::Field { path: path.to_path_buf(), field: field.to_string(), expected: expected.to_string() }
}

/// The known field `name` is one edit or two from (a misspelling), if any.
fn near(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    FIELDS.iter().copied().filter(|k| strsim::levenshtein(&lower, k) <= 2).min_by_key(|k| strsim::levenshtein(name, k))
}

/// A list of `[type, activations, parameters]` triples (`sequence`, `gpumemnet_sequence`).
fn triples(path: &Path, name: &str, v: &Value) -> Result<Vec<Layer>> {
    let list = v.as_array().ok_or_else(|| field(path, name, "expected a list of [type, activations, parameters]"))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let f = format!("{name}[{i}]");
        let arr = item
            .as_array()
            .filter(|a| a.len() == 3)
            .ok_or_else(|| field(path, &f, "expected [type, activations, parameters]"))?;
        let kind = arr[0].as_str().ok_or_else(|| field(path, &format!("{f}[0]"), "expected a layer type string"))?;
        let num =
            |j: usize| arr[j].as_u64().ok_or_else(|| field(path, &format!("{f}[{j}]"), "expected a whole number >= 0"));
        out.push(Layer { kind: kind.to_string(), activations: num(1)?, parameters: num(2)? });
    }
    Ok(out)
}

/// `layers`: an object of `{type, activations, parameters}`, keyed by execution index (a
/// hand-written file) or by module name (the trainer's, beside its ordered `sequence`). The
/// layers, in numeric key order, and whether every key is an index (else the order is unknown).
fn keyed(path: &Path, v: &Value) -> Result<(Vec<Layer>, bool)> {
    let layers = v.as_object().ok_or_else(|| {
        field(
            path,
            "layers",
            "expected an object keyed by execution index ({\"0\": {\"type\", \"activations\", \"parameters\"}, ...})",
        )
    })?;
    let mut out: Vec<(Option<u64>, Layer)> = Vec::with_capacity(layers.len());
    for (k, l) in layers {
        let at = |f: &str| format!("layers.{k}.{f}");
        let kind = l
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| field(path, &at("type"), "expected a string"))?
            .to_string();
        let num = |f: &str| {
            l.get(f).and_then(Value::as_u64).ok_or_else(|| field(path, &at(f), "expected a whole number >= 0"))
        };
        out.push((k.parse().ok(), Layer { kind, activations: num("activations")?, parameters: num("parameters")? }));
    }
    let ordered = out.iter().all(|(i, _)| i.is_some());
    if ordered {
        out.sort_by_key(|(i, _)| *i);
    }
    Ok((out.into_iter().map(|x| x.1).collect(), ordered))
}

/// The layers of `sequence` and `layers` (the trainer writes both, alike): `sequence` unless it
/// is empty and `layers` is not; a disagreement or no layer at all is said.
fn layers(path: &Path, v: &Map<String, Value>, warnings: &mut Vec<String>) -> Result<Vec<Layer>> {
    let given = |name: &str| v.get(name).filter(|x| !x.is_null());
    let seq = given("sequence").map(|s| triples(path, "sequence", s)).transpose()?;
    let keyed = given("layers").map(|l| keyed(path, l)).transpose()?;
    let p = path.display();
    // `layers` read as the list: its keys must give the execution order.
    let ordered = |(layers, ordered): (Vec<Layer>, bool)| -> Result<Vec<Layer>> {
        match ordered {
            true => Ok(layers),
            false => Err(field(
                path,
                "layers",
                "expected numeric layer indices as keys (or give the ordered `sequence` list)",
            )),
        }
    };
    let sorted = |l: &[Layer]| {
        let mut l = l.to_vec();
        l.sort_by(|a, b| (&a.kind, a.activations, a.parameters).cmp(&(&b.kind, b.activations, b.parameters)));
        l
    };
    let layers =
        match (seq, keyed) {
            (None, None) => return Err(field(
                path,
                "layers",
                "expected `sequence` (a list of [type, activations, parameters]) or `layers` keyed by execution index",
            )),
            (None, Some(k)) => ordered(k)?,
            (Some(s), Some(k)) if s.is_empty() && !k.0.is_empty() => {
                let m = k.0.len();
                let k = ordered(k)?;
                warnings.push(format!("{p}: `sequence` is empty but `layers` lists {m} layers: `layers` is used"));
                k
            }
            (Some(s), Some(k)) if sorted(&s) != sorted(&k.0) => {
                warnings.push(format!(
                    "{p}: `sequence` ({} layers) and `layers` ({}) describe different layers: `sequence` is used",
                    s.len(),
                    k.0.len()
                ));
                s
            }
            (Some(s), _) => s,
        };
    Ok(layers)
}

impl FeaturesFile {
    /// Parses `features --json` output; `path` names the input in errors and warnings.
    pub fn parse(text: &str, path: &Path) -> Result<FeaturesFile> {
        let v: Value = serde_json::from_str(text).map_err(|e| {
            // `features --csv` writes a GPUMemNet row, which is easy to hand over by mistake.
            let csv = text.trim_start().starts_with("Filename,");
            let hint = if csv { "; this is a CSV row (features --csv): give `features --json`" } else { "" };
            field(path, "<document>", &format!("expected a JSON object ({e}){hint}"))
        })?;
        let v = v.as_object().ok_or_else(|| field(path, "<document>", "expected a JSON object (`features --json`)"))?;
        // serde_json keeps the last of a key given twice: which one the writer meant is unknown.
        if let Some(key) = duplicate_key(text) {
            return Err(field(path, &key, "expected each key once; this one is given twice (the last would be read)"));
        }
        let mut warnings = Vec::new();
        let unknown: Vec<String> = v
            .keys()
            .filter(|k| !FIELDS.contains(&k.as_str()))
            .map(|k| match near(k) {
                Some(n) => format!("{k:?} (did you mean {n:?}?)"),
                None => format!("{k:?}"),
            })
            .collect();
        if !unknown.is_empty() {
            let (noun, pron) = if unknown.len() == 1 { ("field", "it is") } else { ("fields", "they are") };
            warnings.push(format!(
                "{}: unknown {noun} {}: {pron} ignored (`features --json` writes {})",
                path.display(),
                unknown.join(", "),
                FIELDS.join(", ")
            ));
        }
        let given = |name: &str| v.get(name).filter(|x| !x.is_null());
        let count = |name: &str| {
            v.get(name).and_then(Value::as_u64).ok_or_else(|| field(path, name, "expected a whole number >= 0"))
        };
        let total_parameters = count("total_parameters")?;
        let total_activations = count("total_activations")?;
        // An optional count above zero: absent or null is none.
        let positive = |name: &str| -> Result<Option<u64>> {
            given(name)
                .map(|x| x.as_u64().filter(|&n| n > 0).ok_or_else(|| field(path, name, "expected a whole number >= 1")))
                .transpose()
        };
        let string = |name: &str, expected: &str| -> Result<Option<String>> {
            given(name).map(|m| m.as_str().map(str::to_string).ok_or_else(|| field(path, name, expected))).transpose()
        };
        let batch_size = positive("batch_size")?;
        let model = string("model", "expected the model's name, a string")?;
        let seq_len = positive("seq_len")?;
        let input_shape = given("input_shape")
            .map(|d| {
                d.as_array()
                    .filter(|a| !a.is_empty())
                    .and_then(|a| a.iter().map(|x| x.as_u64().filter(|&n| n > 0)).collect::<Option<Vec<u64>>>())
                    .ok_or_else(|| {
                        field(path, "input_shape", "expected a list of whole numbers >= 1 (one sample's dimensions)")
                    })
            })
            .transpose()?;
        let depth = given("depth")
            .map(|d| {
                d.as_u64().ok_or_else(|| field(path, "depth", "expected a whole number >= 0 (layers with parameters)"))
            })
            .transpose()?;
        let activation_function = string("activation_function", "expected the activation's name, a string, or null")?;
        let gpumemnet_layers = given("gpumemnet_sequence")
            .map(|s| triples(path, "gpumemnet_sequence", s))
            .transpose()?
            .unwrap_or_default();
        let layers = layers(path, v, &mut warnings)?;
        // total_parameters may differ from the layers' sum with no fault (tied embeddings count
        // once in the total and in both layers; a parameter held outside the listed layers in
        // the total alone): a warning of it fired on every tied-embedding model, so none is said.
        if layers.is_empty() {
            let ml = if gpumemnet_layers.is_empty() { ", and ml has no layers to count" } else { "" };
            warnings.push(format!(
                "{}: no layers (`sequence` and `layers` list none): the analytic estimate falls back to the totals \
                 (no per-layer allocator rounding) and adds no cuBLAS or cuDNN memory, and the features give no \
                 family{ml}",
                path.display()
            ));
        }
        Ok(FeaturesFile {
            features: Features { total_parameters, total_activations, batch_size, model, seq_len, input_shape, layers },
            depth,
            activation_function,
            gpumemnet_layers,
            warnings,
        })
    }

    /// Reads and parses a features file.
    pub fn load(path: &Path) -> Result<FeaturesFile> {
        let text = trace::read_small_string(path, 256 << 20).map_err(|source| EstimateError::Io {
            path: path.to_path_buf(),
            action: "cannot read features",
            source,
        })?;
        FeaturesFile::parse(&text, path)
    }
}

/// The first key an object of the JSON `text` holds twice, by its path (`layers.conv1.type`).
pub fn duplicate_key(text: &str) -> Option<String> {
    use serde::de::DeserializeSeed;
    let found = std::cell::RefCell::new(None);
    let mut de = serde_json::Deserializer::from_str(text);
    Dups { path: String::new(), found: &found }.deserialize(&mut de).ok()?;
    found.into_inner()
}

/// Walks a JSON value, recording the first repeated key of any object.
struct Dups<'a> {
    path: String,
    found: &'a std::cell::RefCell<Option<String>>,
}

impl<'de> serde::de::DeserializeSeed<'de> for Dups<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Dups<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> std::result::Result<(), A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(k) = m.next_key::<String>()? {
            let path = if self.path.is_empty() { k.clone() } else { format!("{}.{k}", self.path) };
            if !seen.insert(k) && self.found.borrow().is_none() {
                *self.found.borrow_mut() = Some(path.clone());
            }
            m.next_value_seed(Dups { path, found: self.found })?;
        }
        Ok(())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut s: A) -> std::result::Result<(), A::Error> {
        let mut i = 0;
        while s.next_element_seed(Dups { path: format!("{}[{i}]", self.path), found: self.found })?.is_some() {
            i += 1;
        }
        Ok(())
    }
    fn visit_bool<E>(self, _: bool) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> std::result::Result<(), E> {
        Ok(())
    }
}
