// esid's metrics endpoint (daemon/http/metrics_endpoint.h) on any request
// bytes, as a connection reads them: a request with no blank line within
// kMaxRequestBytes is refused before it is read, else its head goes to
// answerRequest.  The answer is one whole HTTP/1.1 response, closing the
// connection, with a Content-Length that is its body's; its status is what
// a reference reading of the request line says (400 unless "METHOD SP
// TARGET SP HTTP/1.", 404 unless the target before any "?" is /metrics,
// 405 unless GET, else 200); only a 200 calls render, once, and carries
// what it rendered; nothing after the request line changes the answer,
// and nothing of the request is echoed back.
//
// Input: the bytes a scraper sent.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "http/metrics_endpoint.h"

namespace {

constexpr std::string_view kMetrics = "# TYPE esi_up gauge\nesi_up 1\n";

// The request line's status, read with a cursor instead of find().
std::string_view referenceStatus(std::string_view head) {
  std::string_view line = head;
  for (size_t i = 0; i + 1 < head.size(); i++) {
    if (head[i] == '\r' && head[i + 1] == '\n') {
      line = head.substr(0, i);
      break;
    }
  }
  size_t i = 0;
  std::string method, target;
  while (i < line.size() && line[i] != ' ') method += line[i++];
  if (i == line.size()) return "400";
  i++;
  while (i < line.size() && line[i] != ' ') target += line[i++];
  if (i == line.size()) return "400";
  i++;
  if (line.size() - i < 7 || line.substr(i, 7) != "HTTP/1.") return "400";
  const size_t query = target.find('?');
  if (query != std::string::npos) target.resize(query);
  if (target != "/metrics") return "404";
  if (method != "GET") return "405";
  return "200";
}

// The answer's status, checked whole; its body.
std::string_view checkResponse(std::string_view answer, std::string_view* body) {
  FUZZ_CHECK(answer.starts_with("HTTP/1.1 "));
  const std::string_view status = answer.substr(9, 3);
  const size_t headEnd = answer.find("\r\n\r\n");
  FUZZ_CHECK(headEnd != std::string_view::npos);
  const std::string_view head = answer.substr(0, headEnd + 2);
  *body = answer.substr(headEnd + 4);
  FUZZ_CHECK(head.find("\r\nConnection: close\r\n") != std::string_view::npos);
  const std::string length = "\r\nContent-Length: " + std::to_string(body->size()) + "\r\n";
  FUZZ_CHECK(head.find(length) != std::string_view::npos);
  // No bare CR or LF: the head is lines, each ended by CRLF.
  for (size_t i = 0; i < head.size(); i++) {
    if (head[i] == '\r') FUZZ_CHECK(i + 1 < head.size() && head[i + 1] == '\n');
    if (head[i] == '\n') FUZZ_CHECK(i > 0 && head[i - 1] == '\r');
  }
  return status;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string request(reinterpret_cast<const char*>(data), size);
  const size_t end = request.find("\r\n\r\n");
  if (end == std::string::npos || end > esi::MetricsEndpoint::kMaxRequestBytes) {
    return 0;  // 431 or more to read, before answerRequest
  }
  const std::string head = request.substr(0, end);

  int rendered = 0;
  const std::function<std::string()> render = [&rendered] {
    rendered++;
    return std::string(kMetrics);
  };
  const std::string answer = esi::answerRequest(head, render);
  std::string_view body;
  const std::string_view status = checkResponse(answer, &body);
  FUZZ_CHECK(status == referenceStatus(head));
  FUZZ_CHECK(rendered == (status == "200" ? 1 : 0));
  if (status == "200") {
    FUZZ_CHECK(body == kMetrics);
  } else {
    FUZZ_CHECK(body == "bad request line\n" || body == "esid serves /metrics only\n" ||
               body == "GET only\n");
  }

  // The headers after the request line change nothing.
  const size_t lineEnd = head.find("\r\n");
  if (lineEnd != std::string::npos) {
    FUZZ_CHECK(esi::answerRequest(head.substr(0, lineEnd), render) == answer);
  }
  return 0;
}
