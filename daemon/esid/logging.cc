#include "esid/logging.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace esi {

namespace {

// "%*" in a pattern: the syslog priority of the message's level.
class SyslogPriority : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    // trace, debug, info, warn, err, critical, off
    static constexpr char kPriority[] = {'7', '7', '6', '4', '3', '2', '6'};
    const auto level = static_cast<size_t>(msg.level);
    dest.push_back(level < sizeof(kPriority) ? kPriority[level] : '6');
  }

  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<SyslogPriority>();
  }
};

}  // namespace

bool stderrIsJournal() {
  const char* stream = std::getenv("JOURNAL_STREAM");
  if (stream == nullptr) return false;
  unsigned long long device = 0, inode = 0;
  if (std::sscanf(stream, "%llu:%llu", &device, &inode) != 2) return false;
  struct stat st;
  if (fstat(STDERR_FILENO, &st) != 0) return false;
  return st.st_dev == device && st.st_ino == inode;
}

void setUpLogging(spdlog::level::level_enum level) {
  auto logger = spdlog::stderr_color_st("esid");
  if (stderrIsJournal()) {
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<SyslogPriority>('*').set_pattern("<%*>%v");
    logger->set_formatter(std::move(formatter));
  } else {
    logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %l %v");
  }
  spdlog::set_default_logger(std::move(logger));
  spdlog::set_level(level);
}

}  // namespace esi
