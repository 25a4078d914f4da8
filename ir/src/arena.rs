//! Typed `u32` handles into append-only arenas.
//!
//! Every IR entity (`Value`, `Node`, `Const`, `GraphId`, `Sym`, `Ty`) is a distinct handle type,
//! so mixing them up is a type error. Arenas never shrink; deleted nodes are simply no longer
//! listed by their graph.

use std::fmt;
use std::marker::PhantomData;

/// Declares a handle type: a `u32` index with a printed prefix.
macro_rules! entity {
    ($(#[$meta:meta])* $name:ident, $prefix:literal) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(u32);

        impl $name {
            /// The handle for arena slot `index`.
            pub fn from_index(index: usize) -> Self {
                Self(u32::try_from(index).expect("arena holds at most u32::MAX entries"))
            }
            /// The arena slot of this handle.
            pub fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl $crate::arena::EntityRef for $name {
            fn new(index: usize) -> Self {
                Self::from_index(index)
            }
            fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}
pub(crate) use entity;

/// Implemented by handle types; lets [`Arena`] and [`SecondaryMap`] be generic.
pub trait EntityRef: Copy + Eq {
    /// The handle for slot `index`.
    fn new(index: usize) -> Self;
    /// The slot of this handle.
    fn index(self) -> usize;
}

/// An append-only vector indexed by a typed handle.
#[derive(Clone, PartialEq)]
pub struct Arena<K, V> {
    items: Vec<V>,
    _key: PhantomData<fn(K) -> K>,
}

impl<K: EntityRef, V> Default for Arena<K, V> {
    fn default() -> Self {
        Self {
            items: Vec::new(),
            _key: PhantomData,
        }
    }
}

impl<K: EntityRef, V> Arena<K, V> {
    /// An empty arena.
    pub fn new() -> Self {
        Self::default()
    }
    /// Appends `value` and returns its handle.
    pub fn push(&mut self, value: V) -> K {
        let key = K::new(self.items.len());
        self.items.push(value);
        key
    }
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.items.len()
    }
    /// Whether the arena is empty.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
    /// The entry for `key`, if `key` is in range.
    pub fn get(&self, key: K) -> Option<&V> {
        self.items.get(key.index())
    }
    /// Handles and entries in insertion order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (K, &V)> + '_ {
        self.items.iter().enumerate().map(|(i, v)| (K::new(i), v))
    }
    /// Handles in insertion order.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = K> + use<K, V> {
        (0..self.items.len()).map(K::new)
    }
}

impl<K: EntityRef, V> std::ops::Index<K> for Arena<K, V> {
    type Output = V;
    fn index(&self, key: K) -> &V {
        &self.items[key.index()]
    }
}

impl<K: EntityRef, V> std::ops::IndexMut<K> for Arena<K, V> {
    fn index_mut(&mut self, key: K) -> &mut V {
        &mut self.items[key.index()]
    }
}

impl<K: EntityRef + fmt::Debug, V: fmt::Debug> fmt::Debug for Arena<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// A side table keyed by handle (analysis results live here, never in the IR).
#[derive(Clone, Debug)]
pub struct SecondaryMap<K, V> {
    items: Vec<Option<V>>,
    _key: PhantomData<fn(K) -> K>,
}

impl<K: EntityRef, V> Default for SecondaryMap<K, V> {
    fn default() -> Self {
        Self {
            items: Vec::new(),
            _key: PhantomData,
        }
    }
}

impl<K: EntityRef, V> SecondaryMap<K, V> {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets the entry for `key`.
    pub fn insert(&mut self, key: K, value: V) {
        let i = key.index();
        if i >= self.items.len() {
            self.items.resize_with(i + 1, || None);
        }
        self.items[i] = Some(value);
    }
    /// The entry for `key`, if set.
    pub fn get(&self, key: K) -> Option<&V> {
        self.items.get(key.index()).and_then(Option::as_ref)
    }
    /// Whether `key` has an entry.
    pub fn contains(&self, key: K) -> bool {
        self.get(key).is_some()
    }
}
