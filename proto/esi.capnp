@0xd86251cb1504069b;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("esi::wire");
# The only definition of every message between the NGINX connector and esid.
# Framing, ring layout and failure rules: proto/README.md.

const protocolVersion :UInt32 = 7;

# --- Unix socket ----------------------------------------------------------

struct Hello {
  # First message of every connection, client to esid.
  version @0 :UInt32;
  union {
    attach @1 :Void;
    # An NGINX worker asks for a pair of rings; esid answers with Welcome.
    control @2 :Text;
    # esictl: one command line ("stats"); esid answers with ControlReply.
  }
}

struct Welcome {
  # esid to worker, sent with SCM_RIGHTS [memfd, workerEventfd, daemonEventfd,
  # arenaMemfd].
  version @0 :UInt32;
  ringSize @1 :UInt32;
  daemonPid @2 :UInt32;
  arenaSize @3 :UInt64;
  # The segment arena: gzip segments of plans, shared by every worker and
  # mapped read-only (sealed against writes, growth and shrinking).
}

struct ControlReply {
  ok @0 :Bool;
  body @1 :Text;
  # JSON on success, a one-line reason otherwise.
}

# --- Rings ------------------------------------------------------------------

struct Request {
  # Worker to esid. Streams are numbered by the worker, unique per connection.
  stream @0 :UInt32;
  union {
    open @1 :Open;
    body @2 :Data;
    # The next bytes of the stream, in order; offsets count from the first.
    end @3 :Void;
    cancel @4 :Void;
    # The worker abandoned the stream; esid forgets it and sends nothing more.
    zone @5 :Zone;
    # This worker serves a proxy_cache zone: esid indexes it.  No answer.
    stored @6 :Stored;
    # NGINX stored or served a file of a zone.  No answer.
    purge @7 :Purge;
    # Which files must go?  stream is the purge's id; answered by
    # Response.purged.
    purgeDone @8 :PurgeDone;
    # The worker carried out Response.purgeOrder; stream is the order's id.
    replayed @9 :Replayed;
    # The worker replayed its own copy of a reusable plan (Plan.reusable)
    # for a cache hit, without opening a stream.  No answer; written
    # without waking esid (proto/README.md, wake-ups).
  }
}

struct Replayed {
  zone @0 :Text;
  object @1 :Data;
  # As in Open: the plan's zone and the object's 48-byte identity.
  stitched @2 :Bool;
  # The replay named segments.
  uri @3 :Text;
  # The page's decoded path, at most 512 bytes of it, for `esictl log`.
  status @4 :UInt16;
  # The status NGINX answers the page with.
}

struct Zone {
  name @0 :Text;
  path @1 :Text;
  # The zone's directory, absolute.
  indexBytes @2 :UInt64;
  # Memory for its variant index; 0: no index, every purge scans.
  lostReports @3 :Bool;
  # Since its last announcement the worker dropped a Stored report (esid
  # was away, or the queue overflowed): esid's index of the zone is in doubt.
  tagHeaders @4 :Text;
  # esi_purge_tag_headers, separated by spaces: the response headers whose
  # values (split on spaces and commas) are a file's tags, as the worker
  # reads them for its Stored reports; esid's scans read the same.  Empty:
  # esid's default.
}

struct Stored {
  zone @0 :Text;
  key @1 :Text;
  # The cache key text; its MD5 names the main file.
  file @2 :Data;
  # 16 bytes: the file's name, the main MD5 or a Vary variant's.
  tags @3 :Text;
  # Surrogate-Key and xkey values, space separated.
}

struct Purge {
  zone @0 :Text;
  union {
    key @1 :Text;
    # Exact: the key and every Vary variant of it.
    keyPrefix @2 :Text;
    # Wildcard: every key starting with this.
    tag @3 :Text;
    # Every object carrying this Surrogate-Key or xkey tag.
    tagPattern @5 :Text;
    # Every object whose tags, joined with commas in the order they were
    # stored, this RE2 pattern finds anywhere (RE2::PartialMatch: Varnish's
    # `obj.http.X-Magento-Tags ~ pattern`).  At most 64 KiB.
  }
  soft @4 :Bool;
  # A soft purge: the files are marked stale, not removed (the worker
  # writes a past valid_sec into each one's header), so esid's index keeps
  # them.
}

struct Open {
  uri @0 :Text;
  # The page's decoded path, against which relative includes resolve.
  authority @1 :Text;
  # The page's Host; includes must name this authority or none.
  object @2 :Data;
  # A cache hit with esi_plan on: the object's identity, 48 bytes (cache
  # file key 16, then file size, header size, inode and modification time
  # in nanoseconds as little-endian u64).  NGINX writes every store to a
  # new file and renames it into place, so each store has an identity of
  # its own, whatever its response says.  Empty otherwise.
  planZone @3 :Text;
  planZoneBytes @4 :UInt64;
  # The esi_plan_zone the plan lives in, and its size.
  base @5 :UInt64;
  # Stream offset of the first body byte that will be sent: non-zero when
  # the worker dropped a plan there and the rest of the body is parsed.
  planFailed @6 :Bool;
  # The object's plan did not match its body: esid forgets it.
  vars @7 :RequestVars;
  # What ESI variables and `when` tests may read of the request.
  maxTagBytes @8 :UInt32;
  # esi_max_tag_size: the longest ESI tag, attributes included, that is
  # parsed; a longer one passes as text with a warning.  0: esid's default.
  stitchLevel @9 :UInt8;
  # esi_stitch_level when esi_stitch is on, 0 otherwise.  A stream that
  # records a plan records its runs' gzip segments at this level.
  segments @10 :Bool;
  # This response is gzip-stitched: the plan may name segments.
  status @11 :UInt16;
  # The status NGINX answers the page with, for `esictl log`; 0 from a
  # worker that does not say.
}

struct RequestVars {
  # The request's own header values, raw as the client sent them; esid
  # escapes whatever it substitutes.
  host @0 :Text;
  userAgent @1 :Text;
  referer @2 :Text;
  acceptLanguage @3 :Text;
  queryString @4 :Text;
  # Undecoded, without the "?".
  cookies @5 :Text;
  # "a=1; b=2": only the cookies esi_cookies names, none by default.
}

struct Response {
  # esid to worker.
  stream @0 :UInt32;
  union {
    splice @1 :Splice;
    fail @2 :Text;
    # esid gave up on the stream; the worker applies esi_fallback.
    purged @3 :Purged;
    plan @5 :Plan;
    # Answer to an open with an object whose plan esid holds: the worker
    # replays it and sends no body; nothing more comes for this stream.  An
    # open with an object and no plan is answered by an empty splice instead
    # (the worker then sends the body, and esid records its plan).
    purgeOrder @4 :Purge;
    # esictl asked for a purge: the worker carries it out as it would an
    # HTTP purge (asking Request.purge itself) and reports Request.purgeDone
    # under the same stream, which numbers orders in esid's own id space.
    forget @6 :Data;
    # A purge removed these cache files (16 bytes each; empty: too many to
    # list): the worker forgets its copies of their plans and its notes
    # that they have no ESI.  Stream 0; no answer.
  }
}

struct Purged {
  files @0 :Data;
  # 16 bytes per file to remove: mark its keys_zone node, unlink it.
  scanned @1 :Bool;
  # The index could not answer alone: the zone's directory was read.
  error @2 :Text;
  # Non-empty when esid could not find out (unknown zone, unreadable).
  more @3 :Bool;
  # Another Purged for the same purge follows: a long list is split so that
  # each message fits the ring.
  fleet @4 :Text;
  # What became of the purge in esid's fleet (esid(8), Fleet): "" when esid
  # has no fleet (or the purge carries out a fleet entry), "published" when
  # its entry was handed to a live Redis connection, "pending" when it waits
  # in esid's queue for Redis to come back, "refused" when it cannot go on
  # the stream (a zone or key outside the fleet's limits).  The same in
  # every Purged of one purge.
  invalid @5 :Bool;
  # With error: the purge itself is at fault (a pattern RE2 refuses), not
  # esid; the worker answers 400 instead of 503.
}

struct Plan {
  length @0 :UInt64;
  # Body bytes the plan describes; a body of another length drops it.
  steps @1 :List(PlanStep);
  pin @2 :UInt32;
  # Non-zero when steps name segments: esid added one to pin slot pin - 1 of
  # this connection's pin table; the worker subtracts it once it no longer
  # sends any of them, also when it does not use the plan.
  reusable @3 :Bool;
  # The steps read nothing of the request (no variable in a value, an
  # include or a test): the worker may keep this message and replay it, for
  # at most a second, to later hits of the same object, zone and segments
  # without asking (Request.replayed); its copy holds a pin count of its
  # own, raised by the worker while this request's count holds the slot.
}

struct Segment {
  # A verbatim run deflated on its own (raw deflate ended with Z_FULL_FLUSH,
  # so segments and live output concatenate).
  offset @0 :UInt64;
  length @1 :UInt32;
  # Where its compressed bytes are in the arena.
  crc @2 :UInt32;
  # CRC-32 of the run's plaintext, for the gzip trailer.
  head @3 :Data;
  # The run's first bytes: the segment replaces the run only after they are
  # found where the run starts.
}

struct PlanStep {
  union {
    verbatim :group {
      offset @0 :UInt64;
      length @1 :UInt64;
      segment @9 :Segment;
      # Set only for a stream opened with segments.
    }
    include @2 :Include;
    check :group {
      # These bytes must be at this offset, else the plan is dropped there.
      offset @3 :UInt64;
      bytes @4 :Data;
    }
    literal @5 :Data;
    tryStart @6 :Void;
    tryExcept @7 :Void;
    tryEnd @8 :Void;
    # As in Instruction.
  }
}

struct PurgeDone {
  count @0 :UInt64;
  # Files removed.
  scanned @1 :Bool;
  error @2 :Text;
  # Non-empty when the purge could not be carried out.
}

struct Splice {
  released @0 :UInt64;
  # No later instruction refers to a stream byte below this offset.
  last @1 :Bool;
  # The stream is complete; nothing follows.
  instructions @2 :List(Instruction);
  answered @3 :Bool;
  # This splice completes esid's answer to one body or end message; a long
  # answer comes as several splices and only the final one says so.
}

struct Instruction {
  union {
    verbatim :group {
      # Emit these stream bytes as they arrived.
      offset @0 :UInt64;
      length @1 :UInt32;
    }
    include @2 :Include;
    literal @3 :Data;
    # Emit these bytes: text esid made, such as a substituted variable.
    tryStart @4 :Void;
    # <esi:attempt>: hold the output from here until tryExcept.
    tryExcept @5 :Void;
    # The attempt ends.  If one of its includes failed (after alt, and not
    # onerror="continue"), its held output is dropped and what follows up
    # to tryEnd is emitted; otherwise the held output is emitted and what
    # follows up to tryEnd is dropped.  Tries nest.
    tryEnd @6 :Void;
  }
}

struct Include {
  path @0 :Text;
  # Decoded, normalised local path; empty when src was refused.
  args @1 :Text;
  altPath @2 :Text;
  # Empty when there is no usable alt.
  altArgs @3 :Text;
  continueOnError @4 :Bool;
}
