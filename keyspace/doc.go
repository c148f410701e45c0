// Package keyspace decides what key the sidecar stores a client's key under
// upstream. Keys memcached and gomemcache can carry as they are pass
// unchanged; the others are rewritten to at most --key-max-length legal
// bytes by hashing their tenant-bearing segments first, so that the block
// ULID and the short segments stay readable. The package is pure: no sockets,
// no metrics, no flag parsing beyond registering its Config.
//
// # Validation
//
// A client key is accepted (Keyspace.Check) when it is 1 to
// --key-max-client-length bytes (default 2000) and holds no space, CR, LF or
// NUL: what memcached accepts. An accepted key goes upstream unchanged unless
// (Keyspace.NeedsRewrite)
//
//   - it is longer than --key-max-length (default 250),
//   - it holds a control byte (below 0x20) or DEL (0x7f), which gomemcache
//     refuses.
//
// Every other accepted key, one starting with '~' included, goes upstream
// exactly as the client sent it, so existing cache contents stay valid when
// the sidecar is put in. The upstream accepts exactly the keys that pass
// unchanged, so a rewritten key may in principle equal some client's own
// key (for instance a client key that starts with '~'). Keeping the two
// apart is the job of the value envelope, not of the key: every value
// stored under a rewritten key is enveloped with the client key bound into
// it, and on a read under a rewritten key an item that is not such an
// envelope, or whose binding names another key, is a miss. '~' begins none
// of the formats store-gateways write, is not in the Mimir/Cortex tenant
// alphabet (a-zA-Z0-9!-_.*'()), in base64url, in ULIDs or in decimal
// numbers, and is printable, so rewritten keys rarely meet client keys and
// stay readable in logs and in memcached's own dumps.
//
// # Rewrite
//
// The hash of a byte string s, cut to n characters, is
//
//	hash(s, n) = first n characters of base64url-unpadded(blake2b-256(s))
//
// It is unkeyed, so an operator can compute it in a shell:
//
//	printf %s "$s" | b2sum -l 256 | xxd -r -p | basenc --base64url | tr -d = | cut -c1-16
//
// A token is '~' followed by hash(segment, 16), 96 bits: tenants and
// segments would need 2^48 distinct values before two shared a token by
// chance.
//
// With M = --key-max-length, a key K that needs rewriting becomes:
//
//  1. Find the first pattern K matches: user schemes (--key-scheme) in the
//     order given, then the built-in schemes that are on (--key-schemes) in
//     the fixed order of Presets. If none matches, go to step 3.
//  2. Step 1, tenant: "~", then the pattern with every {tenant} and
//     {tenants} segment replaced by its token and every other segment as it
//     is. It is the answer if it is at most M bytes and every segment kept
//     as it is is keepable: no byte ≤ 0x20, no DEL, no '~'. (A pattern
//     without tenant placeholder skips this step.)
//  3. Step 2, segments: replace {1} by its token as well, then {2}, and so
//     on; the first result that passes the same test is the answer.
//  4. Step 3, whole key: "~~" followed by hash(K, 43).
//
// The result is at most M bytes (M ≥ 64 > 45, the length of step 3) of
// bytes gomemcache accepts; it starts with '~'; it depends only on K, the
// scheme flags and M, so every proxy instance sharing the memcached
// servers must be given the same key flags. Because kept segments hold no '~' and tokens have a fixed length,
// the tokens of an upstream key can be read off it, and two keys matched by
// one pattern share an upstream key only if they share a 96-bit token by
// chance. Even then, between unrelated patterns, and against a client key
// equal to a rewritten one, no client is served another key's value: every value stored under a rewritten key carries the
// client key it was written for, and a mismatch is a miss.
//
// The golden vectors in testdata/golden.txt pin this mapping for every
// built-in scheme; a change to it fails the tests.
//
// # Schemes
//
// A scheme is a name and one or more patterns. The flag --key-scheme adds
// one pattern, in the form
//
//	NAME[+postings][+immutable]=PATTERN
//
// NAME is 1 to 40 characters of a-z, 0-9, '-', '_' and '.'; giving it again
// adds another pattern to the same scheme. It cannot be the name of a
// built-in scheme or "none". +postings says the values stored under the
// scheme's keys are postings lists, which the value codec compresses and
// verifies; +immutable says a value stored under one of them never changes
// once written, so the sidecar's local tier may keep it. PATTERN is literal text and placeholders:
//
//	{tenant}    the tenant segment; hashed from step 1 on
//	{tenants}   the same, and must hold a '|' (tenants joined for a
//	            cross-tenant query)
//	{ulid}      exactly 26 Crockford base-32 characters, the first 0-7 (a
//	            block ID); never hashed before step 3
//	{}          any segment; never hashed before step 3
//	{1} … {9}   any segment; hashed at step 2, lowest number first
//	{{  }}      a literal '{' or '}'
//
// A placeholder followed by literal text takes the bytes up to the first
// occurrence of that text, at least one byte; the last placeholder takes the
// rest of the key, at least one byte. There is no backtracking: a pattern
// matches if this left-to-right reading consumes the whole key. Placeholders
// must be separated by literal text, numbers run from {1} without a gap,
// literal text holds no space, control byte, DEL or '~', and a pattern has at
// most 16 placeholders. Examples:
//
//	--key-scheme='loki-index=IDX:{tenant}:{ulid}:{1}'
//	--key-scheme='sessions=sess/{tenant}/{2}/{1}'
//	--key-scheme='my-postings+postings=MP:{tenant}:{ulid}:{2}:{1}'
//	--key-scheme='results=2@QS:{tenants}:{1}'
//
// User schemes are tried before the built-in ones, so a user pattern can
// take over a key shape a built-in scheme would read differently.
//
// # Built-in schemes
//
// --key-schemes takes scheme names, the groups mimir, thanos, cortex (the
// same keys as thanos), bucket and results, all (the default) or none. They
// are tried in this order:
//
//	mimir-p2    +postings  P2:{tenant}:{ulid}:{1}
//	mimir-s                S:{tenant}:{ulid}:{}
//	mimir-e2    +postings  E2:{tenant}:{ulid}:{1}:{}    E2:{tenant}:{ulid}:{1}
//	mimir-sp2              SP2:{tenant}:{ulid}:{2}:{1}  SP2:{tenant}:{ulid}:{1}
//	mimir-ln               LN:{tenant}:{ulid}:{1}
//	mimir-lv2              LV2:{tenant}:{ulid}:{1}:{2}  LV2:{tenant}:{ulid}:{1}
//	mimir-c                C:{tenant}:{ulid}:{}:{}      C:{tenant}:{ulid}:{1}
//	mimir-po               PO{tenant}:{ulid}:{1}
//	mimir-p     +postings  P:{tenant}:{ulid}:{1}
//	mimir-e     +postings  E:{tenant}:{ulid}:{1}
//	mimir-ss               SS:{tenant}:{ulid}:{1}
//	mimir-lv               LV:{tenant}:{ulid}:{1}
//	mimir-sp               SP:{tenant}:{ulid}:{1}
//	thanos-p    +postings  P:{ulid}:{1}:{}              P:{ulid}:{1}
//	thanos-ep   +postings  EP:{ulid}:{1}:{}             EP:{ulid}:{1}
//	thanos-s               S:{ulid}:{}
//	bucket                 V:{ulid}/{1}  V:{tenant}/{ulid}/{1}  V:{tenant}/{1}
//	                       for V in content, exists, attrs, subrange, iter
//	results                {tenants}:{1}  {}:{tenants}:{1}  {}:{tenants}
//
// Every mimir and thanos scheme is immutable (keyed by an immutable
// block), and so are the bucket patterns subrange:{ulid}/{1} and
// subrange:{tenant}/{ulid}/{1} (byte ranges of block files); the other
// bucket keys and the results keys are not.
//
// Mimir's "P:" (tenant, then block) and Thanos's "P:" (block first) share a
// prefix and are told apart by shape: the Mimir patterns want a ULID in the
// second segment, which a Thanos key never has there, and come first because
// a Mimir tenant may itself look like a ULID.
package keyspace
