//! The memsim command end to end (one binary; one module per concept).

mod beside; // what is printed beside a verdict: failed requests' floors, the configuration replayed, report notes, colocate's sum
mod caveats; // what replay and validate say beside their numbers: budgets, settings, damaged snapshots
mod cli; // JSON contracts, conversions, colocate, errors
mod colocate; // colocate on real snapshots: how recordings are lined up
mod convert_pickle; // convert to memory_viz and Perfetto: the verdict kept or the difference said, empty traces, record numbers
mod cupti_mem_cli; // memsim stats: the cupti_memory JSON object and text lines, absent without records
mod damaged; // damaged traces: sums near 2^64, impossible devices, integer tags, refusals that keep files
mod fraction; // a program's memory fraction: its need, and verdicts that agree with the replay at the budget
mod partial; // inputs used in part: snapshot caveats through convert, --strict, double frees, unknown APIs
mod report; // memsim report: the page with profiles and --estimate, bad input
mod report_estimate; // memsim report --estimate: read and worded as memest render reads and words it
mod stdin; // traces on standard input and other streams
mod support; // running the binary
mod util_cli; // memsim stats: the utilization JSON object and text, launch-only message, fallbacks

// Hand-built records and the shared-data paths, from the simulator's tests.
#[path = "../../../simulator/tests/records.rs"]
#[allow(dead_code)]
mod records;
#[path = "../../../simulator/tests/snapshot_support.rs"]
#[allow(dead_code)]
mod snapshot_support;
