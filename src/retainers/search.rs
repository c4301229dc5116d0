//! Breadth-first search from the GC roots to a few target objects: for each target, one shortest
//! chain of references that keeps it alive.
//!
//! The heap comes in through [`HeapGraph`] (the binding walks the VM's real references; the tests
//! walk a fake heap), nodes are opaque `u64`s (object addresses). The search keeps nothing but
//! those numbers, so it holds no reference a GC would see, and it does not call back into the
//! graph once it returns.
//!
//! Bounded three ways, each reported in [`SearchOutcome`] when it cut the search short: a depth
//! (nodes deeper than `max_depth` references from a root are not expanded), a visited-set cap and
//! a time budget (checked every [`TIME_CHECK_EVERY`] expansions). It stops as soon as every target
//! is found. Memory is about 40 bytes per visited node.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::time::{Duration, Instant};

use rustc_hash::FxHasher;

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// Expansions between two looks at the clock.
pub const TIME_CHECK_EVERY: usize = 1024;

/// The heap as the search sees it. Callbacks must not panic out of the graph's own code: the
/// binding calls the VM from them.
pub trait HeapGraph {
    /// Calls `visit(category, node)` for every root reference; `category` names the kind of root
    /// (the VM's own names: "vm", "global_tbl", ...). A node may come more than once.
    fn roots(&mut self, visit: &mut dyn FnMut(&str, u64));
    /// Calls `visit(child)` for every reference `node` holds.
    fn children(&mut self, node: u64, visit: &mut dyn FnMut(u64));
    /// Whether the references `node` holds must not be followed (weak maps: what they hold is
    /// not kept alive by them).
    fn is_weak(&mut self, _node: u64) -> bool {
        false
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SearchLimits {
    /// Most references between a root and a node that is still expanded.
    pub max_depth: u32,
    /// Most distinct nodes the search may hold.
    pub max_visited: usize,
    pub time_budget: Duration,
}

/// What stopped the search before it had found every target or seen every node it could reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    TimeBudget,
    MaxVisited,
}

impl Stop {
    pub fn name(self) -> &'static str {
        match self {
            Stop::TimeBudget => "time_budget",
            Stop::MaxVisited => "max_visited",
        }
    }
}

/// A chain from a root to a target: `nodes[0]` is what the root refers to, the last is the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootPath {
    pub category: String,
    pub nodes: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchOutcome {
    /// One entry per target, in the order given: its path, or `None` when it was not reached.
    pub paths: Vec<Option<RootPath>>,
    pub visited: usize,
    pub elapsed: Duration,
    /// Set when a cap ended the search with targets still unfound.
    pub stopped: Option<Stop>,
    /// Whether some node at `max_depth` had children that were not looked at: an unfound target
    /// may then be deeper, rather than unreachable.
    pub depth_cut: bool,
}

impl SearchOutcome {
    /// Whether a target that was not found is known to be unreachable from every root: the
    /// search saw every node the roots reach.
    pub fn complete(&self) -> bool {
        self.stopped.is_none() && !self.depth_cut
    }
}

const NO_PARENT: u32 = u32::MAX;

struct Node {
    id: u64,
    parent: u32,
    depth: u32,
    category: u32,
}

struct Search<'t> {
    nodes: Vec<Node>,
    index: FxMap<u64, u32>,
    targets: &'t FxMap<u64, Vec<usize>>,
    found: Vec<Option<u32>>,
    remaining: usize,
    max_visited: usize,
    full: bool,
}

impl Search<'_> {
    /// Adds `id` if it is new; sets `full` instead when the visited set has no room.
    fn add(&mut self, id: u64, parent: u32, depth: u32, category: u32) {
        if self.index.contains_key(&id) {
            return;
        }
        if self.nodes.len() >= self.max_visited {
            self.full = true;
            return;
        }
        let at = self.nodes.len() as u32;
        self.nodes.push(Node {
            id,
            parent,
            depth,
            category,
        });
        self.index.insert(id, at);
        if let Some(which) = self.targets.get(&id) {
            for &t in which {
                if let Some(slot) = self.found.get_mut(t) {
                    if slot.is_none() {
                        *slot = Some(at);
                        self.remaining -= 1;
                    }
                }
            }
        }
    }

    fn done(&self) -> bool {
        self.remaining == 0
    }

    fn path(&self, mut at: u32, categories: &[String]) -> Option<RootPath> {
        let mut nodes = Vec::new();
        let mut category = 0;
        while at != NO_PARENT {
            let node = self.nodes.get(at as usize)?;
            nodes.push(node.id);
            category = node.category;
            at = node.parent;
        }
        nodes.reverse();
        Some(RootPath {
            category: categories
                .get(category as usize)
                .cloned()
                .unwrap_or_default(),
            nodes,
        })
    }
}

/// Searches `graph` for `targets` (duplicates allowed; each gets its answer) within `limits`.
pub fn find_root_paths(
    graph: &mut dyn HeapGraph,
    targets: &[u64],
    limits: &SearchLimits,
) -> SearchOutcome {
    let started = Instant::now();
    let mut wanted: FxMap<u64, Vec<usize>> = FxMap::default();
    for (i, &t) in targets.iter().enumerate() {
        wanted.entry(t).or_default().push(i);
    }
    let mut search = Search {
        nodes: Vec::new(),
        index: FxMap::default(),
        targets: &wanted,
        found: vec![None; targets.len()],
        remaining: targets.len(),
        max_visited: limits.max_visited,
        full: false,
    };
    let mut categories: Vec<String> = Vec::new();
    graph.roots(&mut |category, id| {
        let c = match categories.iter().position(|c| c == category) {
            Some(c) => c,
            None => {
                categories.push(category.to_owned());
                categories.len() - 1
            }
        };
        search.add(id, NO_PARENT, 0, c as u32);
    });
    let mut stopped = None;
    let mut depth_cut = false;
    let mut next = 0usize;
    while !search.done() && next < search.nodes.len() {
        if search.full {
            stopped = Some(Stop::MaxVisited);
            break;
        }
        if next % TIME_CHECK_EVERY == 0 && next > 0 && started.elapsed() >= limits.time_budget {
            stopped = Some(Stop::TimeBudget);
            break;
        }
        let (id, depth, category) = match search.nodes.get(next) {
            Some(n) => (n.id, n.depth, n.category),
            None => break,
        };
        let parent = next as u32;
        next += 1;
        if graph.is_weak(id) {
            continue;
        }
        if depth >= limits.max_depth {
            // Only a node with children makes the cut matter.
            let mut any = false;
            graph.children(id, &mut |_| any = true);
            depth_cut |= any;
            continue;
        }
        graph.children(id, &mut |child| {
            if !search.done() {
                search.add(child, parent, depth + 1, category);
            }
        });
    }
    if stopped.is_none() && search.full && !search.done() {
        stopped = Some(Stop::MaxVisited);
    }
    let paths = search
        .found
        .iter()
        .map(|at| at.and_then(|at| search.path(at, &categories)))
        .collect();
    SearchOutcome {
        paths,
        visited: search.nodes.len(),
        elapsed: started.elapsed(),
        stopped,
        depth_cut,
    }
}
