//! Benchmark: the DRA driver under a kubelet's load (issue figures), on the disk (`/tmp`) and
//! on tmpfs (`/dev/shm`): one claim's NodePrepareResources and NodeUnprepareResources p50/p99,
//! a batch of 8 claims, the claim operations per second of 4 concurrent clients (each
//! preparing and unpreparing its own 4 GPUs' claims), and 13 concurrent one-claim Prepares
//! behind 2 s claim reads with an Unprepare sent among them (when the last Prepare and the
//! Unprepare are answered). In process: the driver's handlers with an in-memory claim map.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_slicer::bench::DraClaims;
use gpu_slicer::testkit::percentile;

const RUNS: usize = 201;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    for base in ["/tmp", "/dev/shm"] {
        rt.block_on(figures(base));
    }
}

async fn figures(base: &str) {
    let d = DraClaims::new(base);
    let fs = d.file_system();
    let (mut prep, mut unprep) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        prep.push(d.prepare(&[0]).await);
        unprep.push(d.unprepare(&[0]).await);
    }
    let p = |v: &mut Vec<Duration>, q: f64| percentile(v, q / 100.0);
    println!(
        "FIGURE|DRA Prepare of 1 claim p50/p99 ({fs})|{:.2?} / {:.2?}",
        p(&mut prep, 50.0),
        p(&mut prep, 99.0)
    );
    println!(
        "FIGURE|DRA Unprepare of 1 claim p50/p99 ({fs})|{:.2?} / {:.2?}",
        p(&mut unprep, 50.0),
        p(&mut unprep, 99.0)
    );
    let batch: Vec<usize> = (0..8).collect();
    let (mut bp, mut bu) = (Vec::new(), Vec::new());
    for _ in 0..RUNS / 4 {
        bp.push(d.prepare(&batch).await);
        bu.push(d.unprepare(&batch).await);
    }
    println!(
        "FIGURE|DRA Prepare / Unprepare of a batch of 8 claims p50 ({fs})|{:.2?} / {:.2?}",
        p(&mut bp, 50.0),
        p(&mut bu, 50.0)
    );
    // 4 clients, each on its own 4 claims, prepare then unprepare one claim at a time.
    let d = Arc::new(d);
    let per_client: u32 = 400;
    let start = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..4 {
        let d = d.clone();
        clients.spawn(async move {
            for n in 0..(per_client / 2) as usize {
                let i = 4 * c + n % 4;
                d.prepare(&[i]).await;
                d.unprepare(&[i]).await;
            }
        });
    }
    clients.join_all().await;
    let ops = f64::from(4 * per_client) / start.elapsed().as_secs_f64();
    println!("FIGURE|DRA claim operations per second, 4 concurrent clients ({fs})|{ops:.0}");
    // 13 concurrent Prepares with 2 s reads, an Unprepare of a prepared claim 200 ms in.
    d.prepare(&[13]).await;
    d.slow(Duration::from_secs(2));
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..13 {
        let d = d.clone();
        set.spawn(async move {
            d.prepare(&[i]).await;
            start.elapsed()
        });
    }
    let un = {
        let d = d.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            d.unprepare(&[13]).await
        })
    };
    let last = set.join_all().await.into_iter().max().unwrap_or_default();
    let un = un.await.expect("unprepare task");
    println!(
        "FIGURE|DRA 13 concurrent Prepares behind 2 s claim reads: last answer / an Unprepare among them ({fs})|{last:.2?} / {un:.2?}"
    );
    d.slow(Duration::ZERO);
    d.unprepare(&(0..13).collect::<Vec<_>>()).await;
}
