//! The planner against a model GPU that enforces the driver's rules (the same collision check
//! the fake NVML uses): every pair of valid layouts of every product.

use std::collections::BTreeMap;

use node_spec::{GiProfile, PRODUCTS, Placed, Product, check_place, gi_profiles};
use proptest::prelude::*;

use super::*;

fn facts() -> GpuFacts {
    GpuFacts {
        index: 0,
        uuid: "GPU-0".into(),
        product: "model".into(),
        mig_enabled: true,
    }
}

/// Run `steps` on `gpu` like a driver would; panics on anything a driver refuses.
fn run(product: &Product, gpu: &mut Vec<GiState>, steps: &[Step]) {
    let table = gi_profiles(product);
    let profile = |name: &str| {
        table
            .iter()
            .find(|p| p.name == name)
            .expect("known profile")
    };
    for step in steps {
        match (step.action, step.kind) {
            (Action::Destroy, Kind::ComputeInstance) => {
                let gi = gpu
                    .iter_mut()
                    .find(|g| Some(g.id) == step.gpu_instance_id)
                    .expect("GI exists");
                let before = gi.compute_instances.len();
                gi.compute_instances
                    .retain(|c| Some(c.id) != step.compute_instance_id);
                assert_eq!(gi.compute_instances.len() + 1, before, "CI exists");
            }
            (Action::Destroy, Kind::GpuInstance) => {
                let pos = gpu
                    .iter()
                    .position(|g| Some(g.id) == step.gpu_instance_id)
                    .expect("GI exists");
                assert!(
                    gpu[pos].compute_instances.is_empty(),
                    "GI destroyed with CIs (IN_USE)"
                );
                gpu.remove(pos);
            }
            (Action::Create, Kind::GpuInstance) => {
                let start = step.placement.expect("placement");
                let placed: Vec<Placed<'_>> = gpu
                    .iter()
                    .map(|g| Placed {
                        profile: profile(&g.profile),
                        start: g.start,
                    })
                    .collect();
                let new = Placed {
                    profile: profile(&step.profile),
                    start,
                };
                check_place(product, &placed, new)
                    .unwrap_or_else(|e| panic!("{} at {start}: {e:?}", step.profile));
                let id = (1..).find(|i| gpu.iter().all(|g| g.id != *i)).expect("id");
                gpu.push(GiState {
                    id,
                    profile: step.profile.clone(),
                    start,
                    compute_instances: Vec::new(),
                });
            }
            (Action::Create, Kind::ComputeInstance) => {
                let gi = gpu
                    .iter_mut()
                    .find(|g| Some(g.start) == step.placement && g.profile == step.profile)
                    .expect("parent GI");
                assert!(gi.compute_instances.is_empty(), "second CI");
                gi.compute_instances.push(CiState { id: 0, full: true });
            }
        }
    }
}

fn layout(gpu: &[GiState]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for g in gpu {
        assert_eq!(
            g.compute_instances.len(),
            1,
            "{} has one full CI",
            g.profile
        );
        *m.entry(g.profile.clone()).or_default() += 1;
    }
    m
}

fn counts(t: &[&GiProfile]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for p in t {
        *m.entry(p.name.to_string()).or_default() += 1;
    }
    m
}

/// Every layout of `product` that fits (each a sorted list of profiles).
fn valid_layouts(product: &Product) -> Vec<Vec<&'static GiProfile>> {
    let table = gi_profiles(product);
    let mut out = Vec::new();
    let mut counts = vec![0u32; table.len()];
    loop {
        let t: Vec<&'static GiProfile> = table
            .iter()
            .zip(&counts)
            .flat_map(|(p, &n)| std::iter::repeat_n(p, n as usize))
            .collect();
        if node_spec::search_placements(product, &t, &[]).is_some() {
            out.push(t);
        }
        // Next count vector (odometer over 0..=instance_count).
        let mut i = 0;
        loop {
            if i == table.len() {
                return out;
            }
            counts[i] += 1;
            if counts[i] <= table[i].instance_count {
                break;
            }
            counts[i] = 0;
            i += 1;
        }
    }
}

/// [`valid_layouts`] of every product in [`PRODUCTS`], computed once.
fn all_layouts() -> &'static [Vec<Vec<&'static GiProfile>>] {
    static ALL: std::sync::OnceLock<Vec<Vec<Vec<&'static GiProfile>>>> = std::sync::OnceLock::new();
    ALL.get_or_init(|| PRODUCTS.iter().map(valid_layouts).collect())
}

/// Go from empty to `from`, then to `to`, then plan `to` again.
fn check_pair(product: &Product, from: &[&'static GiProfile], to: &[&'static GiProfile]) {
    let mut gpu = Vec::new();
    let first = plan_gpu(
        &facts(),
        Some(product),
        &Target::Enabled(from.to_vec()),
        &gpu,
    );
    run(product, &mut gpu, &first.steps);
    assert_eq!(layout(&gpu), counts(from));
    let before = gpu.clone();
    let plan = plan_gpu(&facts(), Some(product), &Target::Enabled(to.to_vec()), &gpu);
    assert_eq!(plan.status == PlanStatus::Unchanged, plan.steps.is_empty());
    // Same input, same steps.
    assert_eq!(
        plan,
        plan_gpu(
            &facts(),
            Some(product),
            &Target::Enabled(to.to_vec()),
            &before
        )
    );
    run(product, &mut gpu, &plan.steps);
    assert_eq!(
        layout(&gpu),
        counts(to),
        "{} -> {:?}: {:?}",
        product.name,
        counts(to),
        plan.steps
    );
    let again = plan_gpu(&facts(), Some(product), &Target::Enabled(to.to_vec()), &gpu);
    assert_eq!(again.status, PlanStatus::Unchanged, "{:?}", again.steps);
    assert!(again.steps.is_empty());
    // Nothing that could stay is torn down: an instance in both layouts at a placement the
    // target keeps is never destroyed.
    let destroyed = plan
        .steps
        .iter()
        .filter(|s| s.action == Action::Destroy && s.kind == Kind::GpuInstance)
        .count();
    let created = plan
        .steps
        .iter()
        .filter(|s| s.action == Action::Create && s.kind == Kind::GpuInstance)
        .count();
    assert_eq!(before.len() - destroyed + created, to.len());
}

#[test]
fn every_pair_of_a30_and_a100_layouts() {
    for name in ["A30", "A100-40GB"] {
        let product = PRODUCTS.iter().find(|p| p.name == name).unwrap();
        let layouts = valid_layouts(product);
        assert!(layouts.len() > 10, "{name}: {}", layouts.len());
        for from in &layouts {
            for to in &layouts {
                check_pair(product, from, to);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn random_pairs_on_every_product(p in 0..PRODUCTS.len(), a in any::<prop::sample::Index>(), b in any::<prop::sample::Index>()) {
        let product = &PRODUCTS[p];
        let layouts = &all_layouts()[p];
        let (from, to): (&Vec<&GiProfile>, &Vec<&GiProfile>) = (a.get(layouts), b.get(layouts));
        check_pair(product, from, to);
    }
}

#[test]
fn keeps_what_it_can_and_reports_mig_mode() {
    let product = PRODUCTS.iter().find(|p| p.name == "A100-40GB").unwrap();
    let t = |names: &[&str]| -> Vec<&'static GiProfile> {
        names
            .iter()
            .map(|n| gi_profiles(product).iter().find(|p| p.name == *n).unwrap())
            .collect()
    };
    let mut gpu = Vec::new();
    let first = plan_gpu(
        &facts(),
        Some(product),
        &Target::Enabled(t(&["3g.20gb", "3g.20gb"])),
        &gpu,
    );
    run(product, &mut gpu, &first.steps);
    // One 3g stays, the other becomes 2g + 1g + 1g at its place.
    let plan = plan_gpu(
        &facts(),
        Some(product),
        &Target::Enabled(t(&["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"])),
        &gpu,
    );
    let shape: Vec<(Action, Kind, &str, Option<u32>)> = plan
        .steps
        .iter()
        .map(|s| (s.action, s.kind, s.profile.as_str(), s.placement))
        .collect();
    use Action::*;
    use Kind::*;
    assert_eq!(
        shape,
        [
            (Destroy, ComputeInstance, "3g.20gb", Some(0)),
            (Destroy, GpuInstance, "3g.20gb", Some(0)),
            (Create, GpuInstance, "2g.10gb", Some(0)),
            (Create, ComputeInstance, "2g.10gb", Some(0)),
            (Create, GpuInstance, "1g.5gb", Some(2)),
            (Create, ComputeInstance, "1g.5gb", Some(2)),
            (Create, GpuInstance, "1g.5gb", Some(3)),
            (Create, ComputeInstance, "1g.5gb", Some(3)),
        ]
    );
    let mut off = facts();
    off.mig_enabled = false;
    let p = plan_gpu(&off, Some(product), &Target::Enabled(t(&["3g.20gb"])), &[]);
    assert_eq!(p.status, PlanStatus::Pending);
    assert!(p.reason.unwrap().contains("GPU reset"));
    let p = plan_gpu(&facts(), Some(product), &Target::Disabled, &gpu);
    assert_eq!(p.status, PlanStatus::Pending);
    // A GI without a CI gets one; a GI with a sub-slice CI is rebuilt.
    let half = vec![GiState {
        id: 1,
        profile: "3g.20gb".into(),
        start: 4,
        compute_instances: vec![],
    }];
    let p = plan_gpu(
        &facts(),
        Some(product),
        &Target::Enabled(t(&["3g.20gb"])),
        &half,
    );
    assert_eq!(p.steps.len(), 1);
    assert_eq!(
        (
            p.steps[0].action,
            p.steps[0].kind,
            p.steps[0].gpu_instance_id
        ),
        (Create, ComputeInstance, Some(1))
    );
    let sub = vec![GiState {
        id: 1,
        profile: "3g.20gb".into(),
        start: 4,
        compute_instances: vec![CiState { id: 0, full: false }],
    }];
    let p = plan_gpu(
        &facts(),
        Some(product),
        &Target::Enabled(t(&["3g.20gb"])),
        &sub,
    );
    assert_eq!(p.steps.len(), 4, "{:?}", p.steps);
}
