//! `memsim profile NAME|PATH [--json]`, `memsim profile --list [--json]`: a GPU profile as the one parser reads it. Python reads
//! profiles through this command, so Rust and Python cannot disagree on defaults.

use anyhow::Result;
use simulator::profile::Profile;
use simulator::units::mib;

/// Arguments of `memsim profile`.
#[derive(clap::Args)]
#[command(after_help = "JSON: {\"name\", \"path\", \"gpu\", \"software\", \"outside_allocator\", \"workspace\", \
\"calibration\", \"provenance\": {\"unmeasured\": [...]}, \"derived\": {\"cublas_workspace_bytes\", \
\"cublaslt_workspace_bytes\", \"cudnn_workspace_factor\", \"allocator\"}, \"capacity\": {\"bytes\", \"source\"}}. cublaslt_workspace_bytes is 0 unless the Lt workspace is \
allocated per call.")]
pub struct Args {
    /// A name in profiles/ (e.g. a100-40gb) or a path to a .toml file.
    #[arg(required_unless_present = "list")]
    name: Option<String>,
    /// List the known profiles' names instead (one per line, or a JSON array with --json).
    #[arg(long, conflicts_with = "name")]
    list: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Also check a device capacity as the fit commands read it (e.g. 40GiB): the JSON gains
    /// `capacity` {bytes, source}. Python checks its `--capacity` here before tracing.
    #[arg(long, value_parser = simulator::units::parse_capacity, value_name = "SIZE", allow_negative_numbers = true, conflicts_with = "list")]
    capacity: Option<u64>,
}

pub fn run(a: Args) -> Result<u8> {
    let Some(name) = a.name.as_deref() else {
        let names = simulator::profile::known_profiles();
        if a.json {
            println!("{}", serde_json::to_string(&names)?);
        } else {
            names.iter().for_each(|n| println!("{n}"));
        }
        return Ok(0u8);
    };
    let (p, path) = Profile::load(name)?;
    let (capacity, warnings) = simulator::fit::capacity(a.capacity, Some(&p));
    // Only a --capacity given here can warn (above the GPU's total); the profile's own
    // unmeasured total is listed below with the other unmeasured entries.
    if a.capacity.is_some() {
        for w in &warnings {
            eprintln!("memsim: warning: {w}");
        }
    }
    let lt = if p.workspace.cublaslt_per_call { p.workspace.cublaslt_workspace_kib * 1024 } else { 0 };
    if a.json {
        let mut v = serde_json::to_value(&p)?;
        v["name"] = Profile::name_of(&path).into();
        v["path"] = path.display().to_string().into();
        v["derived"] = serde_json::json!({
            "cublas_workspace_bytes": p.cublas_workspace_bytes(),
            "cublaslt_workspace_bytes": lt,
            "cudnn_workspace_factor": p.workspace.cudnn_workspace_factor,
            "allocator": p.software.allocator,
        });
        v["capacity"] = serde_json::to_value(capacity)?;
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0u8);
    }
    let o = &p.outside_allocator;
    println!("{} ({})", Profile::name_of(&path), path.display());
    println!(
        "  gpu                 {} (cc {}.{}, {} SMs)",
        p.gpu.name, p.gpu.compute_capability[0], p.gpu.compute_capability[1], p.gpu.sm_count
    );
    println!("  total memory        {} ({} B)", mib(p.gpu.total_memory), p.gpu.total_memory);
    if let Some(c) = capacity.filter(|_| a.capacity.is_some()) {
        println!("  capacity            {} ({} B, {})", mib(c.bytes), c.bytes, c.source.describe());
    }
    println!(
        "  software            torch {}, CUDA {}, allocator rules {}",
        p.software.torch, p.software.cuda, p.software.allocator
    );
    println!(
        "  outside allocator   context {} MiB, cuBLAS {} MiB, cuDNN {} MiB",
        o.context_mib, o.cublas_mib, o.cudnn_mib
    );
    println!("  cuBLAS workspace    {} per (handle, stream)", mib(p.cublas_workspace_bytes()));
    println!(
        "  cuBLASLt workspace  {}",
        if lt > 0 { format!("{} per call", mib(lt)) } else { "shared with cuBLAS".into() }
    );
    if p.provenance.unmeasured.is_empty() {
        println!("  unmeasured          none");
    } else {
        println!("  UNMEASURED          {}", p.provenance.unmeasured.join(", "));
    }
    Ok(0u8)
}
