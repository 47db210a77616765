package Test::Nginx::Socket;

# The part of Test::Nginx::Socket that ngx_cache_purge's suite uses, on
# Debian's Test::Base (Debian packages no Test::Nginx): each block's
# configuration written into an nginx.conf of Test::Nginx's shape, a fresh
# nginx started for it, its requests sent, the answers and the error log
# checked.  Each block is one subtest, so that a run's top-level TAP has
# one line per block (tests/compat/run_peer_suite.py counts those).
#
# Sections: http_config, config, request (one request, or an array of
# them under "eval"), error_code, response_body, response_body_like,
# response_headers, error_log, no_error_log, must_die; "eval" on any of
# them.  A block with any other section fails, rather than passing
# unchecked.  $TEST_NGINX_NAME in a configuration is the environment's
# value, as in Test::Nginx.
#
# Environment, as Test::Nginx reads it: TEST_NGINX_BINARY (nginx),
# TEST_NGINX_PORT (1984), TEST_NGINX_SERVROOT (t/servroot),
# TEST_NGINX_LOAD_MODULES (one load_module line each).  One of its own:
# TEST_NGINX_HTTP_CONFIG, lines put first in http {} (the esid socket of
# the ESI module).

use strict;
use warnings;

use Test::Base -base;

use Cwd qw(cwd);
use File::Path qw(make_path remove_tree);
use IO::Socket::INET;
use POSIX qw(WNOHANG);
use Time::HiRes qw(sleep time);

our @EXPORT = qw(run_tests no_long_string server_port server_root);

# hang guards only: nothing is judged by how long it took
my $START_BOUND = 30;
my $STOP_BOUND = 60;
my $REQUEST_TIMEOUT = 30;

my %KNOWN = map { $_ => 1 } qw(http_config config request error_code
    response_body response_body_like response_headers error_log
    no_error_log must_die);

my $Binary = $ENV{TEST_NGINX_BINARY} || 'nginx';
my $Port = $ENV{TEST_NGINX_PORT} || 1984;
my $ServRoot = $ENV{TEST_NGINX_SERVROOT} || cwd() . '/t/servroot';


sub no_long_string () {
    # Test::Nginx abbreviates long strings in failures; these are short
}


sub server_port () {
    return $Port;
}


sub server_root () {
    return $ServRoot;
}


sub run_tests () {
    for my $block (Test::Base::blocks()) {
        Test::More::subtest($block->name, sub { run_block($block) });
    }
}


sub run_block {
    my $block = shift;

    my @unknown = grep { !$KNOWN{$_} } @{ $block->{_section_order}[0] };
    if (@unknown) {
        Test::More::fail("sections this runner does not implement: "
                         . join(', ', @unknown));
        return;
    }

    setup_server_root();
    write_config($block);

    my $started = start_nginx();

    if (defined section($block, "must_die")) {
        Test::More::ok(!$started->{ok}, "nginx refused the configuration");
        check_error_log($block, $started->{stderr});
        stop_nginx() if $started->{ok};
        return;
    }

    if (!$started->{ok}) {
        Test::More::fail("nginx did not start: $started->{stderr}"
                         . read_file("$ServRoot/logs/error.log"));
        return;
    }

    my $requests = listed(section($block, "request"));

    for my $i (0 .. $#$requests) {
        my $res = send_request(substitute($requests->[$i]));
        my ($line) = split /\n/, $requests->[$i];
        my $what = "request " . ($i + 1) . " ($line)";

        if (!defined $res) {
            Test::More::fail("$what: no answer");
            next;
        }

        check_response($block, $i, $what, $res);
    }

    stop_nginx();
    check_error_log($block, '');
}


# a section's value (a block's accessors return a list)

sub section {
    my ($block, $name) = @_;
    my $value = $block->$name;
    return $value;
}


sub listed {
    my $value = shift;
    return ref $value eq 'ARRAY' ? $value : [$value];
}


# the i-th expectation of a section: the i-th of its array, or its only one

sub expected {
    my ($value, $i) = @_;
    return ref $value eq 'ARRAY' ? $value->[$i] : $value;
}


sub check_response {
    my ($block, $i, $what, $res) = @_;
    my ($code, $body, $headers, $like);

    $code = expected(section($block, "error_code"), $i);
    if (defined $code) {
        Test::More::is($res->{status}, $code, "$what: status");
    }

    $body = expected(section($block, "response_body"), $i);
    if (defined $body) {
        if (ref $body eq 'Regexp') {
            Test::More::like($res->{body}, $body, "$what: body");
        } else {
            Test::More::is($res->{body}, $body, "$what: body");
        }
    }

    $like = expected(section($block, "response_body_like"), $i);
    if (defined $like) {
        $like = qr/$like/s unless ref $like eq 'Regexp';
        Test::More::like($res->{body}, $like, "$what: body like");
    }

    $headers = expected(section($block, "response_headers"), $i);
    if (defined $headers) {
        for my $line (split /\n/, $headers) {
            next unless $line =~ /^\s*([^:\s]+)\s*:\s*(.*?)\s*$/;
            Test::More::is($res->{headers}{lc $1}, $2, "$what: header $1");
        }
    }
}


sub check_error_log {
    my ($block, $stderr) = @_;
    my ($log, $pattern);

    $log = read_file("$ServRoot/logs/error.log") . $stderr;

    for $pattern (@{ listed(section($block, "error_log")) }) {
        next unless defined $pattern;
        for my $p (patterns($pattern)) {
            if (ref $p eq 'Regexp') {
                Test::More::like($log, $p, "error log has $p");
            } else {
                Test::More::ok(index($log, $p) >= 0, "error log has \"$p\"");
            }
        }
    }

    for $pattern (@{ listed(section($block, "no_error_log")) }) {
        next unless defined $pattern;
        for my $p (patterns($pattern)) {
            if (ref $p eq 'Regexp') {
                Test::More::unlike($log, $p, "error log has no $p");
            } else {
                Test::More::ok(index($log, $p) < 0,
                               "error log has no \"$p\"")
                    or Test::More::diag($log);
            }
        }
    }
}


# a regular expression, or one substring a line

sub patterns {
    my $pattern = shift;
    return $pattern if ref $pattern eq 'Regexp';
    return grep { length } split /\n/, $pattern;
}


sub substitute {
    my $text = shift;
    $text =~ s/\$(TEST_NGINX_[A-Z0-9_]+)/
               defined $ENV{$1} ? $ENV{$1}
                                : die "$1 is not in the environment\n"/ge;
    return $text;
}


sub setup_server_root {
    remove_tree($ServRoot);
    make_path(map { "$ServRoot/$_" } qw(conf html logs));
}


sub write_config {
    my $block = shift;
    my ($modules, $user, $http, $config);

    $modules = join '', map { "load_module $_;\n" }
                        split ' ', ($ENV{TEST_NGINX_LOAD_MODULES} || '');

    # as root, workers run as root too: the cache is under the test's cwd
    $user = $> == 0 ? "user root;\n" : '';

    $http = substitute(section($block, "http_config") // '');
    $config = substitute(section($block, "config") // '');

    my $extra = $ENV{TEST_NGINX_HTTP_CONFIG} // '';

    write_file("$ServRoot/conf/nginx.conf", <<"_EOC_");
$user${modules}worker_processes 1;
daemon on;
master_process on;
error_log logs/error.log debug;
pid logs/nginx.pid;

events {
    worker_connections 64;
}

http {
    access_log logs/access.log;
    default_type text/plain;

    client_body_temp_path $ServRoot/client_body_temp;
    proxy_temp_path $ServRoot/proxy_temp;
    fastcgi_temp_path $ServRoot/fastcgi_temp;
    uwsgi_temp_path $ServRoot/uwsgi_temp;
    scgi_temp_path $ServRoot/scgi_temp;

$extra
$http

    server {
        listen 127.0.0.1:$Port;
        server_name localhost;

$config

        location / {
            root html;
            index index.html;
        }
    }
}
_EOC_
}


# "nginx -t" says whether the configuration is good; then nginx
# daemonizes, and the port answers.  A sanitized nginx that refuses a
# configuration exits without freeing its first pool, NGINX's way: no leak
# check for "nginx -t".

sub start_nginx {
    my ($cmd, $stderr, $status, $deadline);

    $cmd = "$Binary -p $ServRoot/ -c conf/nginx.conf -e logs/error.log";
    $stderr = "$ServRoot/logs/stderr";

    {
        local $ENV{ASAN_OPTIONS} = join ':', grep { defined }
                                       $ENV{ASAN_OPTIONS}, 'detect_leaks=0';
        $status = system("$cmd -t 2>$stderr");
    }

    $status = system("$cmd 2>>$stderr") if $status == 0;

    if ($status != 0) {
        return { ok => 0, stderr => read_file($stderr) };
    }

    $deadline = time + $START_BOUND;

    while (time < $deadline) {
        my $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                         PeerPort => $Port, Proto => 'tcp');
        if ($sock) {
            close $sock;
            return { ok => 1, stderr => read_file($stderr) };
        }
        sleep 0.05;
    }

    return { ok => 0, stderr => "port $Port never answered\n"
                                . read_file($stderr) };
}


sub stop_nginx {
    my ($pid, $deadline);

    $pid = read_file("$ServRoot/logs/nginx.pid");
    return unless $pid =~ /^(\d+)/;
    $pid = $1;

    kill 'QUIT', $pid;
    $deadline = time + $STOP_BOUND;

    while (kill(0, $pid) && time < $deadline) {
        sleep 0.05;
    }

    if (kill 0, $pid) {
        kill 'KILL', $pid;
        Test::More::fail("nginx $pid did not quit within ${STOP_BOUND}s");
    }
}


# "METHOD URI" (HTTP/1.1 unless it names a version), as Test::Nginx sends
# it: Host localhost, Connection close; the answer read to its end

sub send_request {
    my $request = shift;
    my ($line, $sock, $raw, $res);

    ($line) = split /\n/, $request;
    $line .= ' HTTP/1.1' unless $line =~ m{ HTTP/\d\.\d$};

    $sock = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $Port,
                                  Proto => 'tcp',
                                  Timeout => $REQUEST_TIMEOUT)
        or return undef;

    $sock->timeout($REQUEST_TIMEOUT);
    print $sock "$line\r\nHost: localhost\r\nConnection: close\r\n\r\n";

    local $/;
    local $SIG{ALRM} = sub { die "timeout\n" };
    alarm $REQUEST_TIMEOUT;
    $raw = eval { <$sock> };
    alarm 0;
    close $sock;

    return undef unless defined $raw;
    return parse_response($raw);
}


sub parse_response {
    my $raw = shift;
    my ($head, $body, $res);

    ($head, $body) = split /\r\n\r\n/, $raw, 2;
    $body //= '';

    my @lines = split /\r\n/, $head;
    my $status = shift @lines;
    return undef unless $status =~ m{^HTTP/\d\.\d (\d{3})};

    $res = { status => $1, headers => {}, body => $body };

    for (@lines) {
        $res->{headers}{lc $1} = $2 if /^([^:]+):\s*(.*)$/;
    }

    if (($res->{headers}{'transfer-encoding'} // '') =~ /chunked/i) {
        $res->{body} = dechunk($body);
    }

    return $res;
}


sub dechunk {
    my $chunked = shift;
    my $body = '';

    while ($chunked =~ s/^([0-9a-fA-F]+)[^\r\n]*\r\n//) {
        my $size = hex $1;
        last if $size == 0;
        $body .= substr($chunked, 0, $size);
        substr($chunked, 0, $size + 2) = '';
    }

    return $body;
}


sub read_file {
    my $path = shift;
    open my $fh, '<', $path or return '';
    local $/;
    my $text = <$fh>;
    close $fh;
    return $text // '';
}


sub write_file {
    my ($path, $text) = @_;
    open my $fh, '>', $path or die "$path: $!\n";
    print $fh $text;
    close $fh;
}


1;
