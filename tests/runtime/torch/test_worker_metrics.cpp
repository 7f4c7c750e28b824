// /metrics must work inside a process that links LibTorch + OpenBLAS (edit-train): their
// thread-local storage once made the metrics server's threads fail to start.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "telemetry/telemetry.h"

using namespace edit;

static std::string get(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return "";
  const std::string req = "GET " + path + " HTTP/1.0\r\n\r\n";
  send(fd, req.data(), req.size(), 0);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, n);
  close(fd);
  return out;
}

TEST(WorkerMetricsInTrainerProcess, ServesMetricsNextToLibTorch) {
  auto t = torch::randn({64, 64}).matmul(torch::randn({64, 64}));  // touch BLAS and its TLS
  ASSERT_EQ(t.size(0), 64);
  WorkerMetrics m("127.0.0.1", 0, "job-a", 3, 1, 1);
  StepReport r;
  r.step = 5;
  r.loss = 2.5;
  r.tokens = 1000;
  r.comm[{"allgather", "shard"}] = {4096, 0.25, 3};
  m.update(r);
  const auto body = get(m.port(), "/metrics");
  EXPECT_NE(body.find("200 OK"), std::string::npos) << body;
  EXPECT_NE(body.find("edit_train_loss{"), std::string::npos) << body;
  EXPECT_NE(body.find("edit_comm_bytes_total{"), std::string::npos);
  EXPECT_NE(body.find("rank=\"3\""), std::string::npos);
  EXPECT_NE(get(m.port(), "/nope").find("404"), std::string::npos);
}
