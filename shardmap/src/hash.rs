//! Postgres's own extended hash functions, bit for bit.
//!
//! The keyspace ID of a row is what Postgres's built-in `hash*extended` functions return for its
//! key, so that placement can be checked (and a shard split with a row filter) in plain SQL on
//! any shard. These are ports of `hash_bytes_extended` and `hash_bytes_uint32_extended` from
//! `src/common/hashfn.c` (Bob Jenkins' lookup3), for little-endian servers (x86-64, aarch64):
//! on big-endian hosts Postgres reads the key bytes in another order and gets other values.

#[inline(always)]
fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(4);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(6);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(8);
    *b = b.wrapping_add(*a);
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(16);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(19);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(4);
    *b = b.wrapping_add(*a);
}

#[inline(always)]
fn finalize(a: &mut u32, b: &mut u32, c: &mut u32) {
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(14));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(11));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(25));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(16));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(4));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(14));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(24));
}

/// Initial state plus the optional seed, exactly as both Postgres functions start.
#[inline(always)]
fn init(len: u32, seed: u64) -> (u32, u32, u32) {
    let start = 0x9e37_79b9u32.wrapping_add(len).wrapping_add(3_923_095);
    let (mut a, mut b, mut c) = (start, start, start);
    if seed != 0 {
        a = a.wrapping_add((seed >> 32) as u32);
        b = b.wrapping_add(seed as u32);
        mix(&mut a, &mut b, &mut c);
    }
    (a, b, c)
}

/// Little-endian u32 of up to four bytes, missing bytes read as zero.
#[inline(always)]
fn le_word(bytes: &[u8]) -> u32 {
    let mut w = [0u8; 4];
    w[..bytes.len()].copy_from_slice(bytes);
    u32::from_le_bytes(w)
}

/// `hash_bytes_extended(k, len, seed)`: what `hash_any_extended` returns for these bytes.
pub fn hash_bytes_extended(key: &[u8], seed: u64) -> u64 {
    // Postgres takes the length as an int; keys beyond 1 GiB cannot be Postgres values anyway.
    let (mut a, mut b, mut c) = init(key.len() as u32, seed);
    let mut chunks = key.chunks_exact(12);
    for block in &mut chunks {
        a = a.wrapping_add(le_word(&block[0..4]));
        b = b.wrapping_add(le_word(&block[4..8]));
        c = c.wrapping_add(le_word(&block[8..12]));
        mix(&mut a, &mut b, &mut c);
    }
    let tail = chunks.remainder();
    let n = tail.len();
    // The lowest byte of c is reserved for the length, so tail bytes 8..11 land one byte up.
    a = a.wrapping_add(le_word(&tail[..n.min(4)]));
    if n > 4 {
        b = b.wrapping_add(le_word(&tail[4..n.min(8)]));
    }
    if n > 8 {
        c = c.wrapping_add(le_word(&tail[8..n]) << 8);
    }
    finalize(&mut a, &mut b, &mut c);
    (u64::from(b) << 32) | u64::from(c)
}

/// `hash_bytes_uint32_extended(k, seed)`: the integer hash behind `hashint{2,4,8}extended`.
pub fn hash_uint32_extended(k: u32, seed: u64) -> u64 {
    let (mut a, mut b, mut c) = init(4, seed);
    a = a.wrapping_add(k);
    finalize(&mut a, &mut b, &mut c);
    (u64::from(b) << 32) | u64::from(c)
}

/// `hashint8extended`: folds the high half into the low half so that an int8 holding an int4
/// value hashes like that int4 (the sign decides whether the high half is complemented).
pub fn hashint8extended(value: i64, seed: u64) -> u64 {
    let lo = value as u32;
    let hi = (value >> 32) as u32;
    let folded = if value >= 0 { lo ^ hi } else { lo ^ !hi };
    hash_uint32_extended(folded, seed)
}

/// `hashint4extended`.
pub fn hashint4extended(value: i32, seed: u64) -> u64 {
    hash_uint32_extended(value as u32, seed)
}

/// `hashint2extended`: the int2 is widened to int4 first, sign included.
pub fn hashint2extended(value: i16, seed: u64) -> u64 {
    hash_uint32_extended(i32::from(value) as u32, seed)
}

/// `hashtextextended` under a deterministic collation: the hash of the string's bytes
/// (the database encoding, which for shardgate is UTF-8).
pub fn hashtextextended(value: &str, seed: u64) -> u64 {
    hash_bytes_extended(value.as_bytes(), seed)
}

/// `uuid_hash_extended`: the hash of the 16 bytes of the UUID in network order.
pub fn uuid_hash_extended(value: &[u8; 16], seed: u64) -> u64 {
    hash_bytes_extended(value, seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_widths_agree() {
        for v in [
            0i64,
            1,
            -1,
            42,
            -42,
            i32::MAX as i64,
            i32::MIN as i64,
            32767,
            -32768,
        ] {
            let h8 = hashint8extended(v, 0);
            assert_eq!(h8, hashint4extended(v as i32, 0), "int4 vs int8 for {v}");
            if let Ok(small) = i16::try_from(v) {
                assert_eq!(h8, hashint2extended(small, 0), "int2 vs int8 for {v}");
            }
        }
    }

    #[test]
    fn int8_outside_int4_range_differs_from_truncation() {
        // 2^32 + 5 must not collide with 5: the high half is folded in.
        assert_ne!(
            hashint8extended((1i64 << 32) + 5, 0),
            hashint8extended(5, 0)
        );
    }

    #[test]
    fn seed_changes_the_hash() {
        assert_ne!(hashtextextended("abc", 0), hashtextextended("abc", 1));
        assert_ne!(hashint8extended(7, 0), hashint8extended(7, 1));
    }
}
