//! `deploy/capacity/model.py` (docs/capacity.md) runs on the checked-in costs and its arithmetic
//! is what the page says: figures recomputed here from the same JSON must match its output.

use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn model(args: &[&str]) -> (bool, String, String) {
    let out = Command::new("python3")
        .arg(root().join("deploy/capacity/model.py"))
        .args(args)
        .output()
        .expect("python3 runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn cost(costs: &serde_json::Value, key: &str) -> f64 {
    costs[key]["value"]
        .as_f64()
        .or_else(|| costs[key].as_f64())
        .unwrap_or_else(|| panic!("costs.json has no {key}"))
}

#[test]
fn the_model_counts_what_the_costs_say() {
    let text =
        std::fs::read_to_string(root().join("deploy/capacity/costs.json")).expect("costs.json");
    let costs: serde_json::Value = serde_json::from_str(&text).expect("costs.json is JSON");
    let (ok, out, err) = model(&["--qps", "118.5e6", "--shards", "512"]);
    assert!(ok, "{err}");
    // 118.5M × router µs ÷ 60% ÷ 32 vCPUs, rounded up.
    let routers = (118.5e6 * cost(&costs, "router_us_per_query") / 1e6 / 0.6 / 32.0).ceil();
    assert!(
        out.contains(&format!("| routers (32-vCPU instances) | **{routers}** |")),
        "{out}"
    );
    let loadgens = (118.5e6 * cost(&costs, "loadgen_us_per_query") / 1e6 / 0.5 / 64.0).ceil();
    assert!(
        out.contains(&format!(
            "| loadgen hosts (64-vCPU instances) | **{loadgens}** |"
        )),
        "{out}"
    );
    // Half the speed per vCPU, twice the routers (give or take the rounding up).
    let (ok, slow, err) = model(&["--speedup", "0.5"]);
    assert!(ok, "{err}");
    let twice = (118.5e6 * cost(&costs, "router_us_per_query") / 1e6 / 0.5 / 0.6 / 32.0).ceil();
    assert!(slow.contains(&format!("**{twice}**")), "{slow}");
}

#[test]
fn bad_inputs_are_refused_with_a_reason() {
    let (ok, _, err) = model(&["--router-util", "2"]);
    assert!(!ok && err.contains("--router-util"), "{err}");
    let (ok, _, err) = model(&["--costs", "/nonexistent/costs.json"]);
    assert!(
        !ok && err.contains("cannot read /nonexistent/costs.json"),
        "{err}"
    );
}
