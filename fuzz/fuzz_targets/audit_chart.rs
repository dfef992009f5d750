//! (10) the audit's reading of a chart as a viewer sees it: any UTF-8 text, as
//! `evidence/widths-and-modes/error-vs-bytes.svg`, checked against what that archived run's
//! recomputed values require (its form, panels, markers, legend and what is drawn over what).
//! The expectations are recomputed once per process with the audit's own public checks.
#![no_main]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

use audit::common::npz::Archive;
use audit::packed_kv::comparisons::Recomputed;
use audit::packed_kv::manifest::Manifest;
use audit::packed_kv::plan::{self, ComparisonPlan, Config, InputPlan};
use audit::packed_kv::results::ResultRow;
use audit::{Report, packed_kv};
use fuzz as _;
use libfuzzer_sys::fuzz_target;

struct Expected {
    manifest: Manifest,
    inputs: Vec<InputPlan>,
    plan: Vec<ComparisonPlan>,
    configs: Vec<Config>,
    recomputed: BTreeMap<String, Recomputed>,
}

fn expected() -> &'static Expected {
    static EXPECTED: OnceLock<Expected> = OnceLock::new();
    EXPECTED.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../evidence/widths-and-modes");
        let read = |name: &str| std::fs::read(dir.join(name)).expect("the archived run");
        let manifest: Manifest = serde_json::from_slice(&read("manifest.json")).unwrap();
        let p = &manifest.protocol;
        let inputs = plan::inputs_of(p, None);
        let plan = plan::comparisons(p, &inputs);
        let configs = plan::configs(p);
        let rows: Vec<ResultRow> = serde_json::from_slice(&read("results.json")).unwrap();
        let mut report = Report::new("fuzz");
        let rows = packed_kv::results::check(p, &inputs, &plan, rows, &mut report);
        let archive = Archive::new(read("arrays.npz")).unwrap();
        let recomputed =
            packed_kv::comparisons::check(p, &inputs, &plan, &rows, &archive, &mut report);
        assert!(report.problems.is_empty(), "{}", report.render());
        Expected {
            manifest,
            inputs,
            plan,
            configs,
            recomputed,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(svg) = std::str::from_utf8(data) else {
        return;
    };
    let e = expected();
    let mut report = Report::new("fuzz");
    packed_kv::chart::check(
        svg,
        &e.manifest.protocol,
        &e.inputs,
        &e.plan,
        &e.configs,
        &e.recomputed,
        &mut report,
    );
});
