#include "eval/tasks.h"

#include <fstream>

#include "base/error.h"

namespace astrai::eval {

namespace {

Question parse_question(const std::string& text, const std::string& where) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::parse_error& e) {
    fail(where, ": not valid JSON (", e.what(), ")");
  }
  ASTRAI_CHECK(j.is_object(), where, ": expected a JSON object {\"question\", \"choices\", \"answer\"}");
  Question q;
  q.question = json_required<std::string>(j, "question", where);
  ASTRAI_CHECK(q.question.find_first_not_of(" \t\n\r\v\f") != std::string::npos, where,
               ": \"question\" is empty: there is nothing to condition the choices on");
  const auto choices = j.find("choices");
  ASTRAI_CHECK(choices != j.end() && choices->is_array(), where, ": \"choices\" must be a list of strings");
  ASTRAI_CHECK(!choices->empty(), where, ": \"choices\" is empty");
  for (const Json& c : *choices) {
    ASTRAI_CHECK(c.is_string(), where, ": \"choices\" must be a list of strings, not ", c.dump());
    q.choices.push_back(c.get<std::string>());
  }
  for (size_t c = 0; c < q.choices.size(); ++c)
    ASTRAI_CHECK(!q.choices[c].empty(), where, ": choice ", c, " is an empty string");
  const auto it = j.find("answer");
  ASTRAI_CHECK(it != j.end() && it->is_number_integer(), where, ": \"answer\" must be an integer (the index of the right choice)");
  q.answer = it->get<int64_t>();
  ASTRAI_CHECK(q.answer >= 0 && q.answer < static_cast<int64_t>(q.choices.size()), where, ": answer ", q.answer,
               " is out of range for ", q.choices.size(), " choices");
  return q;
}

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

size_t argmax(const std::vector<double>& v) {
  size_t best = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[best]) best = i;
  return best;
}

}  // namespace

std::vector<Question> read_questions(const std::string& path) {
  std::ifstream in(path);
  ASTRAI_CHECK(in, "--tasks ", path, ": cannot open the file");
  std::vector<Question> out;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Question q = parse_question(line, str_cat(path, ":", n));
    q.line = n;
    out.push_back(std::move(q));
  }
  ASTRAI_CHECK(!out.empty(), "--tasks ", path, ": no questions in the file");
  return out;
}

std::pair<std::string, std::string> context_and_continuation(const std::string& question, const std::string& choice) {
  size_t end = question.size();
  while (end > 0 && is_ascii_space(question[end - 1])) --end;
  return {question.substr(0, end), question.substr(end) + choice};
}

double TaskResult::acc() const { return questions ? static_cast<double>(correct) / static_cast<double>(questions) : 0.0; }
double TaskResult::acc_norm() const {
  return questions ? static_cast<double>(correct_norm) / static_cast<double>(questions) : 0.0;
}

Json TaskResult::to_json() const {
  return Json{{"questions", questions}, {"acc", acc()},       {"acc_norm", acc_norm()},       {"correct", correct},
              {"correct_norm", correct_norm}, {"seconds", seconds}, {"per_question", per_question}};
}

TaskResult summarize_tasks(const std::vector<Question>& questions, const std::vector<std::vector<ChoiceScore>>& scores) {
  ASTRAI_CHECK(scores.size() == questions.size(), "summarize_tasks: ", scores.size(), " scores for ", questions.size(),
               " questions");
  TaskResult r;
  r.per_question = Json::array();
  for (size_t q = 0; q < questions.size(); ++q) {
    const Question& qu = questions[q];
    ASTRAI_CHECK(scores[q].size() == qu.choices.size(), "summarize_tasks: line ", qu.line, ": ", scores[q].size(),
                 " scores for ", qu.choices.size(), " choices");
    std::vector<double> sums, norms;
    Json lps = Json::array(), toks = Json::array();
    for (size_t c = 0; c < qu.choices.size(); ++c) {
      sums.push_back(scores[q][c].logprob);
      norms.push_back(scores[q][c].logprob / static_cast<double>(qu.choices[c].size()));
      lps.push_back(scores[q][c].logprob);
      toks.push_back(scores[q][c].tokens);
    }
    const auto pred = static_cast<int64_t>(argmax(sums)), pred_norm = static_cast<int64_t>(argmax(norms));
    ++r.questions;
    r.correct += pred == qu.answer;
    r.correct_norm += pred_norm == qu.answer;
    r.per_question.push_back(Json{{"line", qu.line}, {"answer", qu.answer}, {"pred", pred}, {"pred_norm", pred_norm},
                                  {"logprobs", lps}, {"tokens", toks}});
  }
  return r;
}

}  // namespace astrai::eval
