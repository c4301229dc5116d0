use std::collections::HashMap;
use std::time::Duration;

use super::*;
use crate::fake_vm::FakeVm;
use crate::{AppRoot, GroupBy, HeapRecorder, NamedFrame, RecorderOptions, SiteOptions, SortBy};

/// A heap: roots (category, node) and the references of each node.
#[derive(Default)]
struct FakeHeap {
    roots: Vec<(&'static str, u64)>,
    edges: HashMap<u64, Vec<u64>>,
    weak: Vec<u64>,
    expanded: usize,
}

impl FakeHeap {
    fn edge(&mut self, from: u64, to: u64) -> &mut Self {
        self.edges.entry(from).or_default().push(to);
        self
    }
}

impl HeapGraph for FakeHeap {
    fn roots(&mut self, visit: &mut dyn FnMut(&str, u64)) {
        for &(c, n) in &self.roots {
            visit(c, n);
        }
    }

    fn children(&mut self, node: u64, visit: &mut dyn FnMut(u64)) {
        self.expanded += 1;
        for &c in self.edges.get(&node).map(Vec::as_slice).unwrap_or(&[]) {
            visit(c);
        }
    }

    fn is_weak(&mut self, node: u64) -> bool {
        self.weak.contains(&node)
    }
}

fn limits() -> SearchLimits {
    SearchLimits {
        max_depth: 30,
        max_visited: 1_000_000,
        time_budget: Duration::from_secs(60),
    }
}

fn nodes(outcome: &SearchOutcome, i: usize) -> Option<(String, Vec<u64>)> {
    outcome.paths[i]
        .as_ref()
        .map(|p| (p.category.clone(), p.nodes.clone()))
}

#[test]
fn finds_a_shortest_path_from_any_root() {
    let mut heap = FakeHeap {
        roots: vec![("vm", 1), ("global_tbl", 10)],
        ..FakeHeap::default()
    };
    // 1 -> 2 -> 3 -> 4 -> 99 is longer than 10 -> 11 -> 99.
    heap.edge(1, 2).edge(2, 3).edge(3, 4).edge(4, 99);
    heap.edge(10, 11).edge(11, 99);
    let outcome = find_root_paths(&mut heap, &[99], &limits());
    assert_eq!(
        nodes(&outcome, 0),
        Some(("global_tbl".into(), vec![10, 11, 99]))
    );
    assert!(outcome.stopped.is_none());
}

#[test]
fn a_root_itself_is_a_path_of_one_node_and_duplicates_get_answers() {
    let mut heap = FakeHeap {
        roots: vec![("vm", 5)],
        ..FakeHeap::default()
    };
    heap.edge(5, 6);
    let outcome = find_root_paths(&mut heap, &[5, 6, 6], &limits());
    assert_eq!(nodes(&outcome, 0), Some(("vm".into(), vec![5])));
    assert_eq!(nodes(&outcome, 1), Some(("vm".into(), vec![5, 6])));
    assert_eq!(nodes(&outcome, 2), nodes(&outcome, 1));
}

#[test]
fn a_cycle_no_root_reaches_is_unreachable_and_the_search_is_complete() {
    let mut heap = FakeHeap {
        roots: vec![("vm", 1)],
        ..FakeHeap::default()
    };
    heap.edge(1, 2).edge(2, 1);
    heap.edge(50, 51).edge(51, 50);
    let outcome = find_root_paths(&mut heap, &[50, 2], &limits());
    assert_eq!(outcome.paths[0], None);
    assert_eq!(nodes(&outcome, 1), Some(("vm".into(), vec![1, 2])));
    assert!(outcome.complete());
    assert_eq!(outcome.visited, 2);
}

#[test]
fn stops_expanding_once_every_target_is_found() {
    let mut heap = FakeHeap {
        roots: vec![("vm", 1)],
        ..FakeHeap::default()
    };
    heap.edge(1, 2);
    for i in 0..1000 {
        heap.edge(2, 100 + i);
        heap.edge(100 + i, 5000 + i);
    }
    let outcome = find_root_paths(&mut heap, &[2], &limits());
    assert_eq!(nodes(&outcome, 0), Some(("vm".into(), vec![1, 2])));
    assert_eq!(heap.expanded, 1, "only the root was expanded");
}

#[test]
fn weak_references_do_not_keep_alive() {
    let mut heap = FakeHeap {
        roots: vec![("vm", 1)],
        weak: vec![2],
        ..FakeHeap::default()
    };
    heap.edge(1, 2).edge(2, 3);
    let outcome = find_root_paths(&mut heap, &[3], &limits());
    assert_eq!(outcome.paths[0], None);
    assert!(outcome.complete());
}

fn chain(len: u64) -> FakeHeap {
    let mut heap = FakeHeap {
        roots: vec![("vm", 0)],
        ..FakeHeap::default()
    };
    for i in 0..len {
        heap.edge(i, i + 1);
    }
    heap
}

#[test]
fn max_depth_bounds_the_path_and_is_reported() {
    let mut heap = chain(100);
    let mut l = limits();
    l.max_depth = 10;
    let outcome = find_root_paths(&mut heap, &[10, 11], &l);
    assert_eq!(nodes(&outcome, 0).unwrap().1.len(), 11);
    assert_eq!(outcome.paths[1], None);
    assert!(outcome.depth_cut);
    assert!(!outcome.complete());
    assert!(outcome.stopped.is_none());
}

#[test]
fn max_visited_caps_the_visited_set() {
    let mut heap = chain(10_000);
    let mut l = limits();
    l.max_depth = 100_000;
    l.max_visited = 500;
    let outcome = find_root_paths(&mut heap, &[9_000], &l);
    assert_eq!(outcome.paths[0], None);
    assert_eq!(outcome.stopped, Some(Stop::MaxVisited));
    assert_eq!(outcome.visited, 500);
}

#[test]
fn the_time_budget_stops_the_search() {
    let mut heap = chain(200_000);
    let mut l = limits();
    l.max_depth = u32::MAX;
    l.time_budget = Duration::ZERO;
    let outcome = find_root_paths(&mut heap, &[199_999], &l);
    assert_eq!(outcome.stopped, Some(Stop::TimeBudget));
    assert_eq!(outcome.paths[0], None);
    assert!(
        outcome.visited <= TIME_CHECK_EVERY + 1,
        "{}",
        outcome.visited
    );
}

fn record(rec: &HeapRecorder, vm: &mut FakeVm, file: &str, line: i32, size: usize, class: &str) {
    let object = vm.alloc(size);
    let frames = [NamedFrame {
        name: "make",
        filename: file,
        line,
    }];
    let gc = vm.gc;
    rec.record_allocation(object, 1, Some(class), &frames, gc)
        .unwrap();
}

#[test]
fn targets_are_the_largest_objects_of_the_top_sites_in_report_order() {
    let rec = HeapRecorder::new(RecorderOptions {
        sample_rate: 1,
        size_enabled: true,
        ..RecorderOptions::default()
    });
    let mut vm = FakeVm::new();
    // Site a.rb:1 holds 3 x 100 = 300 bytes, b.rb:2 holds 2 x 200 = 400, c.rb:3 holds 10.
    for _ in 0..3 {
        record(&rec, &mut vm, "a.rb", 1, 100, "String");
    }
    record(&rec, &mut vm, "b.rb", 2, 150, "Array");
    record(&rec, &mut vm, "b.rb", 2, 250, "Array");
    record(&rec, &mut vm, "c.rb", 3, 10, "Hash");
    rec.commit(&mut vm).unwrap();
    vm.gc();
    let snapshot = rec.prepare_iteration(&mut vm).unwrap();
    let mut size_of: HashMap<i64, usize> = HashMap::new();
    snapshot.for_each_live(|o| {
        size_of.insert(o.record_id, o.data.size);
        true
    });
    let options = SiteOptions {
        by: SortBy::Size,
        group: GroupBy::Site,
        app_root: AppRoot::default(),
    };
    let sites = pick_targets(&snapshot, 2, 1, &options).unwrap();
    assert_eq!(sites.len(), 2);
    assert_eq!(sites[0].site.location, "b.rb:2");
    assert_eq!(sites[0].objects.len(), 1);
    assert_eq!(sites[0].objects[0].size, 250);
    assert_eq!(size_of[&sites[0].objects[0].record_id], 250);
    assert_eq!(sites[0].objects[0].class.as_deref(), Some("Array"));
    assert_eq!(sites[1].site.location, "a.rb:1");

    let by_count = SiteOptions {
        by: SortBy::Count,
        ..options
    };
    let sites = pick_targets(&snapshot, 5, 10, &by_count).unwrap();
    let shape: Vec<_> = sites
        .iter()
        .map(|s| (s.site.location.as_str(), s.objects.len()))
        .collect();
    assert_eq!(shape, [("a.rb:1", 3), ("b.rb:2", 2), ("c.rb:3", 1)]);
    // Equal ages and sizes: the lowest record id first.
    let ids: Vec<i64> = sites[0].objects.iter().map(|o| o.record_id).collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert_eq!(ids, sorted);
    rec.finish_iteration().unwrap();
}
