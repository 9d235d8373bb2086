//! The memory allocator of the family's binaries: a plugin call's
//! allocations bumped out of one static arena, the system's allocator
//! past it.
//!
//! A plugin process lives a few milliseconds and allocates some 140 KiB
//! in all. musl's allocator, which the static builds link, maps and unmaps
//! memory as it goes, each call a page-table change, and unmaps again at
//! exit: 22 `mmap`, `munmap` and `brk` calls for an ADD of ipam-da-pool
//! on the local store, 38 on etcd (docs/performance.md). The arena asks the kernel for nothing: its
//! pages are the binary's zeroed data (no bytes in the file), faulted in
//! as they are first touched. A block freed goes back only when it is the
//! last one handed out, and the last one grows in place: a growing `Vec`
//! or `String` costs no copy. A daemon, which outlives the arena, keeps
//! at most [`ARENA`] bytes of it and allocates the rest from the system,
//! which frees as usual.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The arena's size: an ADD allocates some 140 KiB in all, freed or not.
pub const ARENA: usize = 256 << 10;

/// Memory bumped out of a static arena, and from [`System`] once it is
/// used up. Install it with `#[global_allocator]`.
pub struct Arena {
    memory: UnsafeCell<[u8; ARENA]>,
    /// The offset of the arena's first byte not handed out.
    next: AtomicUsize,
}

// SAFETY: the memory is handed out in disjoint blocks, each claimed by an
// atomic update of `next`: no two threads ever get the same bytes.
unsafe impl Sync for Arena {}

impl Arena {
    /// An empty arena.
    pub const fn new() -> Arena {
        Arena {
            memory: UnsafeCell::new([0; ARENA]),
            next: AtomicUsize::new(0),
        }
    }

    fn start(&self) -> usize {
        self.memory.get() as usize
    }

    /// The offset of `ptr` in the arena, if it is one of its blocks.
    fn offset(&self, ptr: *mut u8) -> Option<usize> {
        let offset = (ptr as usize).wrapping_sub(self.start());
        (offset < ARENA).then_some(offset)
    }

    /// A block for `layout` bumped out of the arena; null if it is used up.
    fn bump(&self, layout: Layout) -> *mut u8 {
        let start = self.start();
        let mut next = self.next.load(Ordering::Acquire);
        loop {
            // Aligned as the address, not the offset: the arena itself is
            // only byte-aligned.
            let aligned = (start + next).next_multiple_of(layout.align()) - start;
            let Some(end) = aligned
                .checked_add(layout.size())
                .filter(|end| *end <= ARENA)
            else {
                return std::ptr::null_mut();
            };
            match self
                .next
                .compare_exchange_weak(next, end, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return (start + aligned) as *mut u8,
                Err(now) => next = now,
            }
        }
    }

    /// Moves the end of the last block handed out, at `offset` and
    /// `old` bytes long, to `new` bytes: false, and nothing moved, if it
    /// is not the last block, or `new` does not fit.
    fn resize_last(&self, offset: usize, old: usize, new: usize) -> bool {
        let Some(end) = offset.checked_add(new).filter(|end| *end <= ARENA) else {
            return false;
        };
        self.next
            .compare_exchange(offset + old, end, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

impl Default for Arena {
    fn default() -> Arena {
        Arena::new()
    }
}

// SAFETY: a block is `layout.size()` bytes at an address aligned to
// `layout.align()`, inside the arena and handed out once until freed, or
// the system allocator's; each is freed or resized by the allocator it
// came from, told apart by its address.
// Each method is called, not copied into every allocation site: inlined,
// they grew the static plugin by 70 KiB.
unsafe impl GlobalAlloc for Arena {
    #[inline(never)]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let block = self.bump(layout);
        if block.is_null() {
            return System.alloc(layout);
        }
        block
    }

    #[inline(never)]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let block = self.bump(layout);
        if block.is_null() {
            return System.alloc_zeroed(layout);
        }
        // Arena memory may have been handed out and given back before.
        std::ptr::write_bytes(block, 0, layout.size());
        block
    }

    #[inline(never)]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match self.offset(ptr) {
            Some(offset) => {
                self.resize_last(offset, layout.size(), 0);
            }
            None => System.dealloc(ptr, layout),
        }
    }

    #[inline(never)]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Some(offset) = self.offset(ptr) else {
            return System.realloc(ptr, layout, new_size);
        };
        if self.resize_last(offset, layout.size(), new_size) {
            return ptr;
        }
        // Not the last block, or no room after it: a new block, with the
        // old one's bytes.
        let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
        let block = self.alloc(new_layout);
        if !block.is_null() {
            std::ptr::copy_nonoverlapping(ptr, block, layout.size().min(new_size));
            self.dealloc(ptr, layout);
        }
        block
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn blocks_are_aligned_and_apart_and_the_last_one_grows_in_place() {
        static ARENA_: Arena = Arena::new();
        // SAFETY: each block is used within the layout it was asked with,
        // and given back with it.
        unsafe {
            let a = ARENA_.alloc(layout(3, 1));
            let b = ARENA_.alloc(layout(16, 16));
            assert_eq!(b as usize % 16, 0);
            assert!(b as usize >= a as usize + 3);
            // The last block grows and shrinks where it is.
            let grown = ARENA_.realloc(b, layout(16, 16), 4096);
            assert_eq!(grown, b);
            let shrunk = ARENA_.realloc(grown, layout(4096, 16), 32);
            assert_eq!(shrunk, b);
            // One not last moves, with its bytes.
            a.write_bytes(7, 3);
            let moved = ARENA_.realloc(a, layout(3, 1), 100);
            assert_ne!(moved, a);
            assert_eq!(std::slice::from_raw_parts(moved, 3), [7, 7, 7]);
            assert!(moved as usize >= b as usize + 32);
            // The last block freed is handed out again.
            ARENA_.dealloc(moved, layout(100, 1));
            assert_eq!(ARENA_.alloc(layout(100, 1)), moved);
        }
    }

    #[test]
    fn only_an_address_inside_the_arena_is_one_of_its_blocks() {
        static ARENA_: Arena = Arena::new();
        let start = ARENA_.start();
        assert_eq!(ARENA_.offset(start as *mut u8), Some(0));
        assert_eq!(
            ARENA_.offset((start + ARENA - 1) as *mut u8),
            Some(ARENA - 1)
        );
        // The system's block could begin just past it, or just before it.
        assert_eq!(ARENA_.offset((start + ARENA) as *mut u8), None);
        assert_eq!(ARENA_.offset((start - 1) as *mut u8), None);
    }

    #[test]
    fn memory_handed_out_again_is_zeroed_when_asked() {
        static ARENA_: Arena = Arena::new();
        // SAFETY: each block is used within the layout it was asked with,
        // and given back with it.
        unsafe {
            let dirty = ARENA_.alloc(layout(64, 8));
            dirty.write_bytes(0xff, 64);
            ARENA_.dealloc(dirty, layout(64, 8));
            let zeroed = ARENA_.alloc_zeroed(layout(64, 8));
            assert_eq!(zeroed, dirty);
            assert!(std::slice::from_raw_parts(zeroed, 64)
                .iter()
                .all(|b| *b == 0));
        }
    }

    #[test]
    fn memory_from_the_system_is_zeroed_when_asked_too() {
        static ARENA_: Arena = Arena::new();
        // SAFETY: each block is used within the layout it was asked with,
        // and given back with it.
        unsafe {
            let all = ARENA_.alloc(layout(ARENA, 1));
            assert!(ARENA_.offset(all).is_some());
            // The system's allocator hands a block freed back out.
            let dirty = ARENA_.alloc(layout(4096, 8));
            assert!(ARENA_.offset(dirty).is_none());
            dirty.write_bytes(0xff, 4096);
            ARENA_.dealloc(dirty, layout(4096, 8));
            let zeroed = ARENA_.alloc_zeroed(layout(4096, 8));
            assert!(std::slice::from_raw_parts(zeroed, 4096)
                .iter()
                .all(|b| *b == 0));
            ARENA_.dealloc(zeroed, layout(4096, 8));
        }
    }

    #[test]
    fn past_the_arena_memory_comes_from_the_system_and_goes_back_to_it() {
        static ARENA_: Arena = Arena::new();
        // SAFETY: each block is used within the layout it was asked with,
        // and given back with it.
        unsafe {
            let most = ARENA_.alloc(layout(ARENA - 64, 1));
            assert!(ARENA_.offset(most).is_some());
            // The last block cannot grow past the end: it moves out.
            let out = ARENA_.realloc(most, layout(ARENA - 64, 1), ARENA + 1);
            assert!(!out.is_null());
            assert!(ARENA_.offset(out).is_none());
            let grown = ARENA_.realloc(out, layout(ARENA + 1, 1), 2 * ARENA);
            assert!(ARENA_.offset(grown).is_none());
            grown.add(2 * ARENA - 1).write(1);
            ARENA_.dealloc(grown, layout(2 * ARENA, 1));
            // What is left of the arena is still handed out.
            let small = ARENA_.alloc(layout(32, 8));
            assert!(ARENA_.offset(small).is_some());
        }
    }

    #[test]
    fn threads_at_once_never_get_the_same_bytes() {
        static ARENA_: Arena = Arena::new();
        let threads: Vec<_> = (0..4u8)
            .map(|mark| {
                std::thread::spawn(move || {
                    let mut blocks = Vec::new();
                    for size in 1..200 {
                        // SAFETY: a block of the arena, written within its
                        // size.
                        unsafe {
                            let block = ARENA_.alloc(layout(size, 8));
                            block.write_bytes(mark, size);
                            blocks.push((block as usize, size));
                        }
                    }
                    blocks
                })
            })
            .collect();
        let mut all: Vec<(usize, usize)> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        all.sort();
        for pair in all.windows(2) {
            assert!(
                pair[0].0 + pair[0].1 <= pair[1].0,
                "blocks overlap: {pair:?}"
            );
        }
    }
}
