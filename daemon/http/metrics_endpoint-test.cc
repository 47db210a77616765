#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "http/metrics_endpoint.h"

namespace esi {
namespace {

std::string render() { return "esid_up 1\n"; }

TEST(ListenAddressTest, TakesNumericAddressesAndAPort) {
  EXPECT_EQ(parseListenAddress("127.0.0.1:9145").address.ss_family, AF_INET);
  EXPECT_EQ(parseListenAddress("[::1]:9145").address.ss_family, AF_INET6);
  EXPECT_EQ(parseListenAddress("0.0.0.0:1").text, "0.0.0.0:1");
  for (const char* bad : {"127.0.0.1", "127.0.0.1:", "localhost:9145", "127.0.0.1:0",
                          "127.0.0.1:65536", "127.0.0.1:91x", "::1:9145", ":9145"}) {
    EXPECT_THROW(parseListenAddress(bad), std::invalid_argument) << bad;
  }
  EXPECT_NO_THROW(parseListenAddress("127.0.0.1:0", true));
}

TEST(AnswerRequestTest, ServesMetricsToGetOnly) {
  const std::string ok = answerRequest("GET /metrics HTTP/1.1\r\nHost: x", render);
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK\r\n", 0), 0u);
  EXPECT_NE(ok.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
  EXPECT_NE(ok.find("Content-Length: 10\r\n"), std::string::npos);
  EXPECT_EQ(ok.substr(ok.size() - 10), "esid_up 1\n");
  EXPECT_EQ(answerRequest("GET /metrics?x=1 HTTP/1.0", render).rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_EQ(answerRequest("GET / HTTP/1.1", render).rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(answerRequest("GET /metricsx HTTP/1.1", render).rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(answerRequest("POST /metrics HTTP/1.1", render).rfind("HTTP/1.1 405", 0), 0u);
  EXPECT_EQ(answerRequest("GET /metrics", render).rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(answerRequest("garbage", render).rfind("HTTP/1.1 400", 0), 0u);
}

// A real client on a thread of its own, the endpoint on this thread's loop.
class MetricsEndpointTest : public ::testing::Test {
 protected:
  // Sends request (then half-closes when asked) and returns all the
  // endpoint wrote until it closed.
  std::string exchange(const std::string& request, bool sendAll = true,
                       uint64_t idleMs = MetricsEndpoint::kIdleTimeoutMs) {
    uv_loop_t loop;
    uv_loop_init(&loop);
    MetricsEndpoint endpoint(&loop, parseListenAddress("127.0.0.1:0", true), render, idleMs);
    endpoint.listen();
    const uint16_t port = endpoint.port();
    uv_async_t done;
    done.data = &endpoint;
    uv_async_init(&loop, &done, [](uv_async_t* async) {
      static_cast<MetricsEndpoint*>(async->data)->close();
      uv_close(reinterpret_cast<uv_handle_t*>(async), nullptr);
    });
    std::string received;
    std::thread client([&] {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in to{};
      to.sin_family = AF_INET;
      to.sin_port = htons(port);
      to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0) {
        if (sendAll) (void)!write(fd, request.data(), request.size());
        char buffer[4096];
        for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) received.append(buffer, n);
      }
      ::close(fd);
      uv_async_send(&done);
    });
    uv_run(&loop, UV_RUN_DEFAULT);
    client.join();
    uv_loop_close(&loop);
    return received;
  }
};

TEST_F(MetricsEndpointTest, AnswersAScrapeAndCloses) {
  const std::string answer = exchange("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  EXPECT_EQ(answer.rfind("HTTP/1.1 200 OK\r\n", 0), 0u);
  EXPECT_NE(answer.find("Connection: close\r\n"), std::string::npos);
  EXPECT_EQ(answer.substr(answer.size() - 10), "esid_up 1\n");
}

TEST_F(MetricsEndpointTest, AnswersOtherPathsWith404) {
  EXPECT_EQ(exchange("GET /admin HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
}

TEST_F(MetricsEndpointTest, RefusesARequestLargerThanItsBound) {
  const std::string huge = "GET /metrics HTTP/1.1\r\nX: " +
                           std::string(MetricsEndpoint::kMaxRequestBytes, 'a') + "\r\n\r\n";
  EXPECT_EQ(exchange(huge).rfind("HTTP/1.1 431", 0), 0u);
}

TEST_F(MetricsEndpointTest, ClosesAConnectionThatSendsNothing) {
  // The client reads until the endpoint closes: it ends only if the idle
  // timer fires.
  EXPECT_EQ(exchange({}, false, 20), "");
}

}  // namespace
}  // namespace esi
