// Runs the producer and consumer examples as two separate processes and
// narrates the hand-off: the producer exits first and the consumer still
// reads correct data.
//   handoff_demo --socket PATH [--size BYTES]
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace {

struct Child {
  pid_t pid = -1;
  FILE* in = nullptr;   // its stdin
  FILE* out = nullptr;  // its stdout
};

Child Spawn(const std::string& path, std::vector<std::string> args) {
  int to_child[2], from_child[2];
  if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) std::exit(1);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
  std::vector<char*> argv{const_cast<char*>(path.c_str())};
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  Child c;
  if (posix_spawn(&c.pid, path.c_str(), &fa, nullptr, argv.data(), environ) != 0) {
    std::perror(path.c_str());
    std::exit(1);
  }
  posix_spawn_file_actions_destroy(&fa);
  close(to_child[0]);
  close(from_child[1]);
  c.in = fdopen(to_child[1], "w");
  c.out = fdopen(from_child[0], "r");
  return c;
}

std::string ReadLine(Child& c, const char* who) {
  char buf[512];
  if (!std::fgets(buf, sizeof(buf), c.out)) {
    std::fprintf(stderr, "demo: %s ended early\n", who);
    std::exit(1);
  }
  std::string s(buf);
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

void Tell(Child& c, const char* line) {
  std::fprintf(c.in, "%s\n", line);
  std::fflush(c.in);
}

int Wait(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket, size = std::to_string(64 << 20);
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--socket")) socket = argv[i + 1];
    else if (!std::strcmp(argv[i], "--size")) size = argv[i + 1];
  }
  if (socket.empty()) {
    std::fprintf(stderr, "usage: handoff_demo --socket PATH [--size BYTES]\n");
    return 2;
  }
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return 1;
  self[n] = '\0';
  std::string dir(self);
  dir = dir.substr(0, dir.rfind('/'));

  Child consumer = Spawn(dir + "/consumer", {"--socket", socket});
  Child producer = Spawn(dir + "/producer", {"--socket", socket, "--consumer-pid",
                                             std::to_string(consumer.pid), "--size", size});
  std::printf("demo: producer pid %d, consumer pid %d\n", producer.pid, consumer.pid);

  std::string token_line = ReadLine(producer, "producer");
  std::printf("demo: producer exported its buffer only to pid %d: %s\n", consumer.pid,
              token_line.c_str());
  Tell(consumer, token_line.c_str());
  std::printf("demo: consumer: %s\n", ReadLine(consumer, "consumer").c_str());

  Tell(producer, "exit");
  int prc = Wait(producer.pid);
  std::printf("demo: producer exited with status %d\n", prc);

  Tell(consumer, "recheck");
  std::string second = ReadLine(consumer, "consumer");
  std::printf("demo: consumer: %s\n", second.c_str());
  int crc = Wait(consumer.pid);
  std::printf("demo: consumer exited with status %d\n", crc);
  bool ok = prc == 0 && crc == 0 && second.rfind("VERIFIED", 0) == 0;
  std::printf("demo: %s\n", ok ? "PASS - the data outlived its producer" : "FAIL");
  return ok ? 0 : 1;
}
