//! Label bins: GPUMemNet's memory bins, and the low/medium/high utilisation bins.

use serde::{Deserialize, Serialize};

use crate::features::Family;

/// GPUMemNet relabels OOM rows of the CNN and Transformer sweeps to this many MiB, so that they
/// fall in the top 8000-MiB bin.
pub const OOM_RELABEL_MIB: f64 = 42_000.0;

/// Which side of each interval is closed (pandas `pd.cut(..., right=...)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Closed {
    /// `(lo, hi]`, pandas `right=True`.
    Right,
    /// `[lo, hi)`, pandas `right=False`.
    Left,
}

/// Consecutive intervals over a scalar target; class `i` is the interval between `edges[i]` and
/// `edges[i + 1]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Binning {
    /// Strictly increasing edges; the first may be `-inf` and the last `+inf`.
    #[serde(with = "edges_json")]
    pub edges: Vec<f64>,
    /// Which side of each interval is closed.
    pub closed: Closed,
    /// Names of the classes, one per interval, for reports.
    pub names: Vec<String>,
}

impl Binning {
    /// Builds bins from edges, naming each class after its interval.
    pub fn new(edges: Vec<f64>, closed: Closed) -> Binning {
        let names = edges
            .windows(2)
            .map(|w| match closed {
                Closed::Right => format!("({}, {}]", fmt_edge(w[0]), fmt_edge(w[1])),
                Closed::Left => format!("[{}, {})", fmt_edge(w[0]), fmt_edge(w[1])),
            })
            .collect();
        Binning { edges, closed, names }
    }

    /// GPUMemNet's MLP bins: 1000-MiB wide, right-closed, (1000, 2000] ... (5000, inf).
    pub fn gpumemnet_mlp() -> Binning {
        Binning::new(vec![1000.0, 2000.0, 3000.0, 4000.0, 5000.0, f64::INFINITY], Closed::Right)
    }

    /// GPUMemNet's CNN and Transformer bins: 8000-MiB wide, left-closed, [0, 8000) ...
    /// [40000, 50000) (the last bin is 10000 wide in GPUMemNet's code).
    pub fn gpumemnet_8gb() -> Binning {
        Binning::new(vec![0.0, 8000.0, 16000.0, 24000.0, 32000.0, 40000.0, 50000.0], Closed::Left)
    }

    /// The memory bins GPUMemNet uses for a family.
    pub fn memory_for(family: Family) -> Binning {
        match family {
            Family::Mlp => Binning::gpumemnet_mlp(),
            Family::Cnn | Family::Transformer => Binning::gpumemnet_8gb(),
        }
    }

    /// Number of classes.
    pub fn classes(&self) -> usize {
        self.edges.len().saturating_sub(1)
    }

    /// The class of `v`, or `None` when it lies outside every interval (pandas gives NaN).
    pub fn class_of(&self, v: f64) -> Option<usize> {
        if v.is_nan() {
            return None;
        }
        self.edges.windows(2).position(|w| match self.closed {
            Closed::Right => v > w[0] && v <= w[1],
            Closed::Left => v >= w[0] && v < w[1],
        })
    }

    /// The interval `(lower, upper)` edges of class `c`.
    pub fn interval(&self, c: usize) -> (f64, f64) {
        (self.edges[c], self.edges[c + 1])
    }

    /// The estimate a classifier reports for class `c`: the bin's upper edge, as GPUMemNet does;
    /// for an unbounded top bin, its lower edge (the only finite figure it carries).
    pub fn estimate(&self, c: usize) -> f64 {
        let (lo, hi) = self.interval(c);
        if hi.is_finite() {
            hi
        } else {
            lo
        }
    }
}

fn fmt_edge(e: f64) -> String {
    if e.is_infinite() {
        "inf".into()
    } else if e.fract() == 0.0 && e.abs() < 1e15 {
        format!("{}", e as i64)
    } else {
        format!("{e}")
    }
}

mod edges_json {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// JSON has no infinities: non-finite edges are written as the strings "inf" / "-inf".
    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    enum Edge {
        Num(f64),
        Text(String),
    }

    pub fn serialize<S: Serializer>(edges: &[f64], s: S) -> Result<S::Ok, S::Error> {
        let v: Vec<Edge> = edges
            .iter()
            .map(|&e| {
                if e.is_finite() {
                    Edge::Num(e)
                } else if e > 0.0 {
                    Edge::Text("inf".into())
                } else {
                    Edge::Text("-inf".into())
                }
            })
            .collect();
        v.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
        Vec::<Edge>::deserialize(d)?
            .into_iter()
            .map(|e| match e {
                Edge::Num(v) => Ok(v),
                Edge::Text(t) if t == "inf" => Ok(f64::INFINITY),
                Edge::Text(t) if t == "-inf" => Ok(f64::NEG_INFINITY),
                Edge::Text(t) => {
                    Err(serde::de::Error::custom(format!("bin edge {t:?}: expected a number, \"inf\" or \"-inf\"")))
                }
            })
            .collect()
    }
}
