#include "Json.h"

#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace conformance {

class Parser {
public:
  explicit Parser(const std::string &t) : t_(t) {}

  Json document() {
    Json v = value();
    ws();
    if (p_ != t_.size())
      fail("trailing characters");
    return v;
  }

private:
  [[noreturn]] void fail(const std::string &what) const {
    throw std::runtime_error("JSON: " + what + " at offset " + std::to_string(p_));
  }
  void ws() {
    while (p_ < t_.size() && (t_[p_] == ' ' || t_[p_] == '\n' || t_[p_] == '\t' || t_[p_] == '\r'))
      ++p_;
  }
  bool eat(char c) {
    ws();
    if (p_ < t_.size() && t_[p_] == c) {
      ++p_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c))
      fail(std::string("expected '") + c + "'");
  }
  bool word(const char *w) {
    std::string s(w);
    if (t_.compare(p_, s.size(), s) != 0)
      return false;
    p_ += s.size();
    return true;
  }

  Json value() {
    ws();
    if (p_ >= t_.size())
      fail("unexpected end");
    Json v;
    char c = t_[p_];
    if (c == '{') {
      ++p_;
      v.kind_ = Json::Kind::Object;
      if (eat('}'))
        return v;
      do {
        ws();
        std::string k = string();
        expect(':');
        v.o_[k] = value();
      } while (eat(','));
      expect('}');
    } else if (c == '[') {
      ++p_;
      v.kind_ = Json::Kind::Array;
      if (eat(']'))
        return v;
      do
        v.a_.push_back(value());
      while (eat(','));
      expect(']');
    } else if (c == '"') {
      v.kind_ = Json::Kind::String;
      v.s_ = string();
    } else if (word("true") || word("false")) {
      v.kind_ = Json::Kind::Bool;
      v.b_ = c == 't';
    } else if (word("null")) {
      v.kind_ = Json::Kind::Null;
    } else {
      number(v);
    }
    return v;
  }

  void number(Json &v) {
    std::size_t start = p_;
    bool real = false;
    while (p_ < t_.size() && std::string("+-0123456789.eE").find(t_[p_]) != std::string::npos) {
      real |= t_[p_] == '.' || t_[p_] == 'e' || t_[p_] == 'E';
      ++p_;
    }
    if (p_ == start)
      fail("unexpected character");
    std::string s = t_.substr(start, p_ - start);
    char *end = nullptr;
    if (real) {
      v.kind_ = Json::Kind::Real;
      v.d_ = std::strtod(s.c_str(), &end);
    } else {
      v.kind_ = Json::Kind::Int;
      v.i_ = std::strtoll(s.c_str(), &end, 10);
      v.d_ = static_cast<double>(v.i_);
    }
    if (*end != '\0')
      fail("bad number '" + s + "'");
  }

  std::string string() {
    if (p_ >= t_.size() || t_[p_] != '"')
      fail("expected a string");
    ++p_;
    std::string s;
    while (p_ < t_.size() && t_[p_] != '"') {
      char c = t_[p_++];
      if (c != '\\') {
        s += c;
        continue;
      }
      if (p_ >= t_.size())
        fail("bad escape");
      char e = t_[p_++];
      switch (e) {
      case 'n': s += '\n'; break;
      case 't': s += '\t'; break;
      case 'r': s += '\r'; break;
      case 'b': s += '\b'; break;
      case 'f': s += '\f'; break;
      case 'u': {
        if (p_ + 4 > t_.size())
          fail("bad \\u escape");
        unsigned cp = std::stoul(t_.substr(p_, 4), nullptr, 16);
        p_ += 4;
        if (cp < 0x80) {
          s += static_cast<char>(cp);
        } else if (cp < 0x800) {
          s += static_cast<char>(0xC0 | (cp >> 6));
          s += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
          s += static_cast<char>(0xE0 | (cp >> 12));
          s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
          s += static_cast<char>(0x80 | (cp & 0x3F));
        }
        break;
      }
      default: s += e; // \" \\ \/
      }
    }
    if (p_ >= t_.size())
      fail("unterminated string");
    ++p_;
    return s;
  }

  const std::string &t_;
  std::size_t p_ = 0;
};

Json Json::parse(const std::string &text) { return Parser(text).document(); }

static void need(bool ok, const char *what) {
  if (!ok)
    throw std::runtime_error(std::string("JSON: value is not ") + what);
}

bool Json::asBool() const {
  need(isBool(), "a bool");
  return b_;
}
std::int64_t Json::asInt() const {
  need(isInt(), "an integer");
  return i_;
}
double Json::asDouble() const {
  need(isNumber(), "a number");
  return d_;
}
const std::string &Json::asString() const {
  need(isString(), "a string");
  return s_;
}
const std::vector<Json> &Json::items() const {
  need(isArray(), "an array");
  return a_;
}
const std::map<std::string, Json> &Json::members() const {
  need(isObject(), "an object");
  return o_;
}
bool Json::has(const std::string &key) const { return isObject() && o_.count(key); }
const Json &Json::operator[](const std::string &key) const {
  static const Json null;
  need(isObject(), "an object");
  auto it = o_.find(key);
  return it == o_.end() ? null : it->second;
}
const Json &Json::operator[](std::size_t i) const { return items().at(i); }
std::size_t Json::size() const { return isArray() ? a_.size() : members().size(); }

std::vector<std::int64_t> Json::asInts() const {
  std::vector<std::int64_t> v;
  for (const Json &j : items())
    v.push_back(j.asInt());
  return v;
}

std::string Json::dump() const {
  std::ostringstream os;
  switch (kind_) {
  case Kind::Null: os << "null"; break;
  case Kind::Bool: os << (b_ ? "true" : "false"); break;
  case Kind::Int: os << i_; break;
  case Kind::Real: os << d_; break;
  case Kind::String: os << '"' << s_ << '"'; break;
  case Kind::Array:
    os << '[';
    for (std::size_t i = 0; i < a_.size(); ++i)
      os << (i ? "," : "") << a_[i].dump();
    os << ']';
    break;
  case Kind::Object: {
    os << '{';
    bool first = true;
    for (const auto &[k, v] : o_) {
      os << (first ? "" : ",") << '"' << k << "\":" << v.dump();
      first = false;
    }
    os << '}';
    break;
  }
  }
  return os.str();
}

} // namespace conformance
