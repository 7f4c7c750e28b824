// The store's data and its semantics (TCPStore's): what the server serves and rank 0
// calls directly.
#include <algorithm>
#include <stdexcept>

#include "dist/kv_wire.h"

namespace edit {

using kv::Clock;
using kv::deadlineAfter;
using kv::keyList;
using kv::printable;
using std::chrono::milliseconds;

bool KvTable::allPresent(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data_.count(k) > 0; });
}

void KvTable::setOnChange(std::function<void(const std::string&)> f) {
  std::lock_guard<std::mutex> lock(hookMu_);
  onChange_ = std::move(f);
}

void KvTable::changed(const std::string& key) {
  changed_.notify_all();
  std::lock_guard<std::mutex> lock(hookMu_);
  if (onChange_) onChange_(key);
}

void KvTable::checkValue(const std::string& key, const Bytes& value) const {
  if (value.size() > limits_.maxValueBytes)
    throw KvError("store: a value of " + std::to_string(value.size()) + " bytes for key " + printable(key) +
                  " is over the limit of " + std::to_string(limits_.maxValueBytes) + " bytes");
}

void KvTable::set(const std::string& key, const Bytes& value) {
  checkValue(key, value);
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = value;
  }
  changed(key);
}

void KvTable::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = deadlineAfter(timeout.count(), Clock::now());
  while (!allPresent(keys)) {
    if (stopped_) throw KvError("store: the store is shutting down");
    if (deadline == Clock::time_point::max()) {
      changed_.wait(lock);
    } else if (changed_.wait_until(lock, deadline) == std::cv_status::timeout && !allPresent(keys)) {
      throw KvError("store: timed out after " + std::to_string(timeout.count()) + " ms waiting for " +
                    keyList(keys));
    }
  }
}

Bytes KvTable::get(const std::string& key, milliseconds timeout) {
  wait({key}, timeout);
  std::lock_guard<std::mutex> lock(mu_);
  return data_.at(key);
}

bool KvTable::tryGet(const std::string& key, Bytes* value) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  *value = it->second;
  return true;
}

int64_t KvTable::add(const std::string& key, int64_t delta) {
  int64_t sum = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t cur = 0;
    auto it = data_.find(key);
    if (it != data_.end()) {
      const std::string text(it->second.begin(), it->second.end());
      try {
        size_t used = 0;
        cur = std::stoll(text, &used);
        if (used != text.size()) throw std::invalid_argument(text);
      } catch (const std::exception&) {
        throw KvError("store: add on key " + printable(key) + ", which holds \"" + printable(text, 64) +
                      "\", not an integer");
      }
    }
    if (__builtin_add_overflow(cur, delta, &sum))
      throw KvError("store: add of " + std::to_string(delta) + " to key " + printable(key) + " (" +
                    std::to_string(cur) + ") overflows 64 bits");
    const std::string s = std::to_string(sum);
    data_[key] = Bytes(s.begin(), s.end());
  }
  changed(key);
  return sum;
}

Bytes KvTable::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  checkValue(key, desired);
  Bytes result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    if (it == data_.end()) {
      if (!expected.empty()) return expected;
      data_[key] = desired;
      result = desired;
    } else if (it->second == expected) {
      it->second = desired;
      result = desired;
    } else {
      return it->second;
    }
  }
  changed(key);
  return result;
}

bool KvTable::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  return allPresent(keys);
}

bool KvTable::deleteKey(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return data_.erase(key) > 0;
}

int64_t KvTable::numKeys() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(data_.size());
}

void KvTable::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
  }
  changed_.notify_all();
}

}  // namespace edit
