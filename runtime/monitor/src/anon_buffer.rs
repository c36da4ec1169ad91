//! A large byte buffer that is an anonymous mapping of its own rather than a heap allocation.
//!
//! Two processes here keep such a buffer and fork or live long beside many others: the zygote
//! (its request buffer, inherited by every fork) and each monitor (the buffer container output
//! is read into). Only the pages a read fills become resident, where a zeroed heap buffer is
//! written whole by calloc; and a fork can let go of every page of it with one `munmap`, where
//! a heap buffer keeps at least the page holding glibc's chunk header (freeing it would raise
//! glibc's mmap threshold in the fork instead).

/// An anonymous mapping of `len` bytes, or a heap buffer if the mapping fails.
pub enum AnonBuffer {
    Mapped(std::ptr::NonNull<u8>, usize),
    Heap(Vec<u8>),
}

impl AnonBuffer {
    pub fn new(len: usize) -> AnonBuffer {
        // SAFETY: a fresh private anonymous mapping, owned by the value returned. nix's mmap,
        // munmap and madvise would need the same blocks (memory is at stake), and nix has no
        // mincore (the tests'), so this file stays on libc.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        match std::ptr::NonNull::new(p.cast::<u8>()) {
            Some(ptr) if p != libc::MAP_FAILED => AnonBuffer::Mapped(ptr, len),
            _ => AnonBuffer::Heap(vec![0u8; len]),
        }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match self {
            // SAFETY: the mapping is `len` bytes, readable and writable, zero-filled by the
            // kernel, and only this value refers to it.
            AnonBuffer::Mapped(ptr, len) => unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), *len) },
            AnonBuffer::Heap(v) => v,
        }
    }

    /// Give the kernel back every page of the buffer, in a forked child that will not use it
    /// again: the parent goes on writing into its own copy, and each page both still shared
    /// would become the child's own for as long as it lives. A mapping is unmapped whole (the
    /// buffer is empty afterwards); of a heap buffer only the whole pages inside it can go, the
    /// allocation itself stays.
    pub fn release_in_fork(&mut self) {
        match self {
            AnonBuffer::Mapped(ptr, len) => {
                // SAFETY: unmapping the mapping made in `new`; `self` no longer refers to it
                // once replaced below, and no slice of it outlives this `&mut` borrow.
                unsafe { libc::munmap(ptr.as_ptr().cast(), *len) };
                *self = AnonBuffer::Heap(Vec::new());
            }
            AnonBuffer::Heap(v) => {
                let page = crate::sys::page_size();
                let start = (v.as_mut_ptr() as usize).next_multiple_of(page);
                let end = (v.as_mut_ptr() as usize + v.len()) & !(page - 1);
                if start < end {
                    // SAFETY: [start, end) lies inside `v`, borrowed mutably here; on private
                    // anonymous memory MADV_DONTNEED only makes the pages read back as zeros.
                    unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
                }
            }
        }
    }
}

impl Drop for AnonBuffer {
    fn drop(&mut self) {
        if let AnonBuffer::Mapped(ptr, len) = self {
            // SAFETY: unmapping the mapping made in `new`; no slice of it outlives `self`.
            unsafe { libc::munmap(ptr.as_ptr().cast(), *len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resident_pages(ptr: *const u8, len: usize) -> usize {
        let page = crate::sys::page_size();
        let mut vec = vec![0u8; len.div_ceil(page)];
        // SAFETY: mincore only reports on the range, which is one mapping of `len` bytes.
        let r = unsafe { libc::mincore(ptr as *mut libc::c_void, len, vec.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().filter(|b| *b & 1 == 1).count()
    }

    #[test]
    fn only_written_pages_are_resident_and_a_fork_release_unmaps_all() {
        let len = 64 * crate::sys::page_size();
        let mut b = AnonBuffer::new(len);
        let AnonBuffer::Mapped(ptr, _) = b else {
            panic!("the mapping failed")
        };
        assert_eq!(resident_pages(ptr.as_ptr(), len), 0, "nothing written yet");
        b.as_mut_slice()[..10].copy_from_slice(b"0123456789");
        assert_eq!(resident_pages(ptr.as_ptr(), len), 1, "one page written");
        assert_eq!(&b.as_mut_slice()[..10], b"0123456789");
        b.release_in_fork();
        assert!(b.as_mut_slice().is_empty());
        // SAFETY: mincore on an unmapped range only fails with ENOMEM.
        let r = unsafe { libc::mincore(ptr.as_ptr().cast(), len, [0u8; 64].as_mut_ptr()) };
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::ENOMEM));
        assert_eq!(r, -1, "the whole mapping is gone");
    }

    #[test]
    fn a_heap_buffer_keeps_its_allocation_and_drops_its_inner_pages() {
        let len = 64 * crate::sys::page_size();
        let mut b = AnonBuffer::Heap(vec![7u8; len]);
        b.release_in_fork();
        let s = b.as_mut_slice();
        assert_eq!(s.len(), len, "the allocation stays");
        let page = crate::sys::page_size();
        let first_whole = (s.as_ptr() as usize).next_multiple_of(page) - s.as_ptr() as usize;
        assert!(
            s[first_whole..first_whole + page].iter().all(|b| *b == 0),
            "inner pages read back as zeros"
        );
    }
}
