@0xd86251cb1504069b;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("esi::wire");
# The only definition of every message between the NGINX connector and esid.
# Framing, ring layout and failure rules: proto/README.md.

const protocolVersion :UInt32 = 1;

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
  # esid to worker, sent with SCM_RIGHTS [memfd, workerEventfd, daemonEventfd].
  version @0 :UInt32;
  ringSize @1 :UInt32;
  daemonPid @2 :UInt32;
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
  }
}

struct Open {
  uri @0 :Text;
  # The page's decoded path, against which relative includes resolve.
  authority @1 :Text;
  # The page's Host; includes must name this authority or none.
}

struct Response {
  # esid to worker.
  stream @0 :UInt32;
  union {
    splice @1 :Splice;
    fail @2 :Text;
    # esid gave up on the stream; the worker applies esi_fallback.
  }
}

struct Splice {
  released @0 :UInt64;
  # No later instruction refers to a stream byte below this offset.
  last @1 :Bool;
  # The stream is complete; nothing follows.
  instructions @2 :List(Instruction);
}

struct Instruction {
  union {
    verbatim :group {
      # Emit these stream bytes as they arrived.
      offset @0 :UInt64;
      length @1 :UInt32;
    }
    include @2 :Include;
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
