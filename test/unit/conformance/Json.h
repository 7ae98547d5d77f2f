// A small JSON reader for the conformance golden file (the test must not need
// more than GoogleTest). Integers and reals stay distinct, as in the file:
// `2` is an int argument, `2.0` a floating one.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace conformance {

class Json {
public:
  enum class Kind { Null, Bool, Int, Real, String, Array, Object };

  // Throws std::runtime_error with the offset of the first syntax error.
  static Json parse(const std::string &text);

  Kind kind() const { return kind_; }
  bool isNull() const { return kind_ == Kind::Null; }
  bool isBool() const { return kind_ == Kind::Bool; }
  bool isInt() const { return kind_ == Kind::Int; }
  bool isNumber() const { return kind_ == Kind::Int || kind_ == Kind::Real; }
  bool isString() const { return kind_ == Kind::String; }
  bool isArray() const { return kind_ == Kind::Array; }
  bool isObject() const { return kind_ == Kind::Object; }

  bool asBool() const;
  std::int64_t asInt() const;
  double asDouble() const; // ints too
  const std::string &asString() const;
  const std::vector<Json> &items() const;               // array
  const std::map<std::string, Json> &members() const;   // object
  bool has(const std::string &key) const;               // object member present
  const Json &operator[](const std::string &key) const; // object member or null
  const Json &operator[](std::size_t i) const;          // array element
  std::size_t size() const;                              // array or object

  std::vector<std::int64_t> asInts() const;
  // Compact re-serialisation, for messages.
  std::string dump() const;

private:
  friend class Parser;
  Kind kind_ = Kind::Null;
  bool b_ = false;
  std::int64_t i_ = 0;
  double d_ = 0;
  std::string s_;
  std::vector<Json> a_;
  std::map<std::string, Json> o_;
};

} // namespace conformance
